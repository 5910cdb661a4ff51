"""The per-token test's statistics (sapo_async/node/token_test.py): valid under the null,
sharp against a token or a run of tokens out of place."""

from __future__ import annotations

import math

import torch

from sapo_async.node.token_test import completion_test, token_stats

VOCAB = 49_152  # SmolLM2's vocabulary


def _logits(n: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    # peaked next-token distributions, as a language model's are (a few nats of entropy)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=gen) * 3.0


def _sampled(logits: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.multinomial(torch.softmax(logits.double(), -1), 1, generator=gen).squeeze(-1)


def test_the_statistics_match_their_definitions_on_a_small_vocabulary() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64))
    stats = token_stats(logits, torch.tensor([1]))
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    entropy = float(-(p * p.log()).sum())
    assert (
        float(stats.surprisal[0]) == math.log(1 / 0.3)
        or abs(float(stats.surprisal[0]) - math.log(1 / 0.3)) < 1e-12
    )
    assert abs(float(stats.entropy[0]) - entropy) < 1e-12
    assert abs(float(stats.variance[0]) - (float((p * p.log() ** 2).sum()) - entropy**2)) < 1e-12
    assert abs(float(stats.tail[0]) - 0.5) < 1e-12  # 0.3 and 0.2: at most as likely as 0.3


def test_tokens_sampled_from_the_policy_give_valid_tails_and_a_standard_z() -> None:
    # The null: each token drawn from the distribution the test reads (300 completions of
    # 32 tokens; the property does not depend on the vocabulary's size, so a 1,024-token
    # one keeps the test quick). The tail is a valid p-value, P(tail <= a) <= a, and near
    # uniform at the low end where the test reads it; z has mean about 0 and variance
    # about 1; the Bonferroni p-value is below 0.01 in about 1 % or fewer.
    tails, zs, p_mins = [], [], []
    for c in range(300):
        logits = _logits(32, seed=c, vocab=1024)
        stats = token_stats(logits, _sampled(logits, seed=10_000 + c))
        tails.append(stats.tail)
        test = completion_test(stats)
        zs.append(test.z)
        p_mins.append(test.p_min)
    tail = torch.cat(tails)
    for a in (0.01, 0.05, 0.1, 0.5, 0.9):
        assert float((tail <= a).double().mean()) <= a + 0.01
    assert float((tail <= 0.1).double().mean()) >= 0.08
    mean = sum(zs) / len(zs)
    var = sum((z - mean) ** 2 for z in zs) / (len(zs) - 1)
    assert abs(mean) < 0.2
    assert 0.75 < var < 1.3
    assert sum(p < 0.01 for p in p_mins) / len(p_mins) <= 0.02


def test_one_token_out_of_place_is_caught_by_its_tail() -> None:
    logits = _logits(32, seed=1)
    tokens = _sampled(logits, seed=2)
    clean = completion_test(token_stats(logits, tokens))
    tokens[16] = int(logits[16].argmin())  # the least likely token at one position
    dirty = completion_test(token_stats(logits, tokens))
    assert dirty.p_min < 1e-6 < clean.p_min


def test_a_run_of_unlikely_tokens_raises_z() -> None:
    # ten positions each take a token from the lower half of its distribution: none alone
    # is far out of place, together they are
    logits = _logits(32, seed=3)
    tokens = _sampled(logits, seed=4)
    clean = completion_test(token_stats(logits, tokens))
    ranks = logits.argsort(dim=-1)
    for t in range(10):
        tokens[t] = int(ranks[t, VOCAB // 4])
    dirty = completion_test(token_stats(logits, tokens))
    assert dirty.z > clean.z + 5


def test_an_empty_completion_passes() -> None:
    test = completion_test(token_stats(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long)))
    assert (test.tokens, test.p_min, test.z) == (0, 1.0, 0.0)


def test_the_one_p_value_is_about_valid_under_the_null_and_reads_both_tests() -> None:
    # 2,000 completions sampled from the distribution the test reads: the p-value (token
    # test and surprisal excess, Bonferroni) is below a in about a of them at 32 tokens (the
    # excess's normal approximation is heavier-tailed on shorter ones: the module says).
    ps = []
    for c in range(2000):
        logits = _logits(32, seed=50_000 + c, vocab=1024)
        ps.append(completion_test(token_stats(logits, _sampled(logits, seed=90_000 + c))).p_value)
    for a in (0.001, 0.01, 0.05):
        assert sum(p < a for p in ps) / len(ps) <= 1.5 * a + 0.001
    logits = _logits(32, seed=7)
    tokens = _sampled(logits, seed=8)
    tokens[5] = int(logits[5].argmin())  # one token far out of place
    assert completion_test(token_stats(logits, tokens)).p_value < 1e-6
    ranks = logits.argsort(dim=-1)
    run = _sampled(logits, seed=8)
    for t in range(12):  # a run of tokens from the lower half, none alone far out
        run[t] = int(ranks[t, VOCAB // 4])
    test = completion_test(token_stats(logits, run))
    assert test.p_min > 1e-3
    assert test.p_value < 1e-3


def test_statistics_taken_a_chunk_of_positions_at_a_time_are_the_whole_ones() -> None:
    """At a real vocabulary and a long completion, the float64 statistics of every position
    at once took several GB; a chunk at a time they are the same figures, position by
    position (and so the same test)."""
    torch.manual_seed(3)
    logits = torch.randn(40, 49_152) * 3
    tokens = torch.randint(0, 49_152, (40,))
    whole = token_stats(logits, tokens, chunk=40)
    chunked = token_stats(logits, tokens, chunk=7)
    for name in ("surprisal", "entropy", "variance", "tail"):
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name
    assert completion_test(whole) == completion_test(chunked)
