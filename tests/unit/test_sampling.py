"""Explicit sampling filters: temperature, top-k (0 = off), top-p (1 = off); the draw."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from sapo_async.errors import ConfigError
from sapo_async.policy.generation.base import check_sampling
from sapo_async.policy.generation.sampling import draw, filter_logits, inverse_cdf
from sapo_async.wire import SamplingParams

LOGITS = torch.tensor([[0.0, 1.0, 2.0, 3.0]])


def _kept(out: torch.Tensor) -> list[bool]:
    return torch.isfinite(out)[0].tolist()


def test_no_filter_keeps_everything_and_top_k_zero_is_off() -> None:
    out = filter_logits(LOGITS, SamplingParams(top_k=0, top_p=1.0))
    assert torch.equal(out, LOGITS)


def test_top_k_keeps_the_k_most_likely() -> None:
    assert _kept(filter_logits(LOGITS, SamplingParams(top_k=2))) == [False, False, True, True]


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.5, [False, False, False, True]), (0.7, [False, False, True, True]), (0.99, [True] * 4)],
)
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_p: float, kept: list[bool]) -> None:
    # softmax: 0.032, 0.087, 0.237, 0.644
    assert _kept(filter_logits(LOGITS, SamplingParams(top_p=top_p))) == kept


def test_temperature_divides_logits() -> None:
    out = filter_logits(LOGITS, SamplingParams(temperature=2.0))
    assert out.tolist() == [[0.0, 0.5, 1.0, 1.5]]


@pytest.mark.parametrize(
    ("params", "name"),
    [
        (SamplingParams(temperature=0.0), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (SamplingParams(temperature=math.nan), "temperature"),
    ],
)
def test_bad_sampling_parameters_name_the_field(params: SamplingParams, name: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        check_sampling(params)
    assert info.value.field == f"sampling.{name}"


def test_draw_follows_each_rows_distribution_at_a_real_vocabulary() -> None:
    # SmolLM2's vocabulary, the mass on four entries spread over it (the first and the last
    # included); 64 rows x 200 steps = 12,800 draws, checked by a chi-square test at
    # p = 0.001 (3 degrees of freedom: 16.27).
    vocab, support, weights = 49_152, [0, 17, 25_000, 49_151], [0.1, 0.2, 0.3, 0.4]
    probs = torch.zeros(64, vocab)
    probs[:, support] = torch.tensor(weights)
    gen = torch.Generator().manual_seed(0)
    drawn = torch.cat([draw(probs, gen) for _ in range(200)])
    assert set(drawn.tolist()) <= set(support)
    counts = torch.tensor([(drawn == s).sum().item() for s in support], dtype=torch.float64)
    expected = torch.tensor(weights, dtype=torch.float64) * drawn.numel()
    assert float(((counts - expected) ** 2 / expected).sum()) < 16.27


def test_draw_is_seeded_and_rows_draw_independently() -> None:
    probs = torch.full((8, 1000), 1e-3)
    first = draw(probs, torch.Generator().manual_seed(3))
    assert torch.equal(first, draw(probs, torch.Generator().manual_seed(3)))
    assert len(set(first.tolist())) > 1


@pytest.mark.parametrize("total", [1.0, 0.7])
def test_a_zero_mass_entry_is_never_drawn_even_at_the_ends_of_u(total: float) -> None:
    # Mass on entries 1 and 3 only; u at 0, at the boundary between them, and within
    # 2^-53 of 1 (where u * total can round up to the total itself).
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0], dtype=torch.float64) * total
    cdf = probs.cumsum(-1).repeat(3, 1)
    u = torch.tensor([[0.0], [0.5], [1.0 - 2.0**-53]], dtype=torch.float64)
    assert inverse_cdf(cdf, u).tolist() == [1, 3, 3]


def test_the_head_sees_one_contiguous_position_per_row_and_the_prompts_last(tiny_lm: Any) -> None:
    # The prefill's last position used to reach the head as a strided slice of the
    # prompts' hidden states; torch then copied the head's weight once per row (256 ms of a
    # 2.9 s SmolLM2 generation). Every head input is now [rows, 1, hidden] and contiguous,
    # and the first token's log-prob is the one a plain forward gives at the prompt's end.
    from sapo_async.policy.generation.sampling import sample_batch

    model = tiny_lm.model
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    seen: list[tuple[tuple[int, ...], bool]] = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda _m, args: seen.append((tuple(args[0].shape), args[0].is_contiguous()))
    )
    try:
        out = sample_batch(
            model,
            prompts,
            SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=3),
            n=2,
            stop_ids=[],
            pad_id=0,
            seed=1,
        )
    finally:
        hook.remove()
    assert seen[0] == ((3, 1, model.config.hidden_size), True)
    assert all(contiguous and shape[1] == 1 for shape, contiguous in seen)
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
            for row in (2 * i, 2 * i + 1):
                first = out.token_ids[row][0]
                assert out.logprobs[row][0] == pytest.approx(float(logp[first]), abs=1e-5)
