"""The candidate view computes each completion's log-probs once (their device is checked on a GPU
by bench/gpu_check.py: the meta-device stand-in cannot run the view's masked gather)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from sapo_async.node.view import CandidateView
from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup, TokenSource

VOCAB = 11


class _Tokenizer:
    eos_token_id = 10
    pad_token_id = 0
    all_special_ids = (0, 10)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [1 + (ord(ch) % 9) for ch in text]}

    def __len__(self) -> int:
        return VOCAB

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)  # spells no text: peer ids never match here


class _Model(torch.nn.Module):
    """A causal LM of one parameter, on ``device``; records its inputs' devices."""

    def __init__(self, device: str, vocab: int = VOCAB) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(vocab, vocab, device=device))
        self.seen: list[tuple[torch.device, int]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        self.seen.append((input_ids.device, int(input_ids.shape[0])))
        return SimpleNamespace(logits=self.weight[input_ids])


def _view(model: _Model) -> CandidateView:
    group = ScoredGroup(
        prompt="2+2",
        completions=(
            ScoredCompletion("4", 1.0, "stop", token_ids=(5, 10)),
            ScoredCompletion("5", 0.0, "length"),
            ScoredCompletion("44", 1.0, "stop"),
        ),
        tokenizer_id="tok",
        producer="0xpeer",
        token_source=TokenSource.TEXT,
    )
    return CandidateView(
        group, model=model, tokenizer=_Tokenizer(), tokenizer_id="tok", add_special_tokens=False
    )


def test_each_completion_is_run_once_however_often_it_is_asked_for() -> None:
    model = _Model("cpu")
    view = _view(model)
    first = view.logprobs([0])
    view.logprobs([0, 1])
    view.logprobs([2, 1, 0])
    assert [rows for _, rows in model.seen] == [1, 1, 1]
    assert torch.equal(view.logprobs([0])[0], first[0])


def test_the_trainer_gets_the_receivers_own_ids_and_only_matching_behaviour_log_probs() -> None:
    view = _view(_Model("cpu"))
    assert view.token_ids[0] == (1 + ord("4") % 9, 10)
    trained = view.trained_group()
    assert trained.token_source is TokenSource.RECEIVER
    assert [c.token_ids for c in trained.completions] == list(view.token_ids)
    assert trained.prompt_token_ids == view.prompt_ids
    # The peer's (5, 10) are not the text's own tokens: its behaviour log-probs (none
    # here) could not be kept, and the ids trained on are the receiver's.
    assert not view.peer_ids_match(0)
    assert all(c.behaviour_logprobs is None for c in trained.completions)


def _bpe() -> Any:
    """A real byte-level BPE tokenizer with merges ("12" is one token), as real models have."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["12 + 30 = 42", "12 12 12 answer 42 42"] * 50, trainer)
    fast: Any = PreTrainedTokenizerFast
    return fast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def _bpe_view(tokenizer: Any, *runs: tuple[str, tuple[int, ...]]) -> CandidateView:
    group = ScoredGroup(
        prompt="12 + 30 =",
        completions=tuple(
            ScoredCompletion(
                text, 1.0, "stop", token_ids=ids, behaviour_logprobs=tuple([-0.5] * len(ids))
            )
            for text, ids in runs
        ),
        tokenizer_id="tok",
        producer="0xpeer",
        token_source=TokenSource.TEXT,
    )
    return CandidateView(
        group,
        model=_Model("cpu"),
        tokenizer=tokenizer,
        tokenizer_id="tok",
        add_special_tokens=False,
    )


def test_a_bpe_peers_sampled_split_that_spells_its_text_passes_and_is_trained_as_sampled() -> None:
    # A sampling policy may emit "1" then "2" where the tokenizer would write "12": the run
    # spells the text exactly, so it is the peer's honest sample, not a mismatch.
    tok = _bpe()
    eos = tok.eos_token_id
    canonical = tuple(tok("12", add_special_tokens=False)["input_ids"])
    split = (*tok.convert_tokens_to_ids(["1", "2"]), eos)
    assert len(canonical) == 1
    assert tok.decode(split[:-1]) == "12"
    view = _bpe_view(tok, ("12", split))
    assert view.peer_ids_match(0)
    trained = view.trained_group().completions[0]
    assert trained.token_ids == split  # what the peer sampled, with its log-probs
    assert trained.behaviour_logprobs == (-0.5, -0.5, -0.5)


def test_a_run_that_spells_other_text_or_hides_a_special_token_fails_the_token_check() -> None:
    tok = _bpe()
    eos, unk = tok.eos_token_id, tok.unk_token_id
    other = (*tok("42", add_special_tokens=False)["input_ids"], eos)
    hidden = (*tok.convert_tokens_to_ids(["1"]), unk, *tok.convert_tokens_to_ids(["2"]), eos)
    no_stop = (*tok("12", add_special_tokens=False)["input_ids"], unk)
    view = _bpe_view(tok, ("12", other), ("12", hidden), ("12", no_stop), ("12", (10**6, eos)))
    assert [view.peer_ids_match(i) for i in range(4)] == [False] * 4
    # The trainer then gets the receiver's own tokens of the text, without the peer's
    # log-probs.
    for c in view.trained_group().completions:
        assert c.token_ids == (*tok("12", add_special_tokens=False)["input_ids"], eos)
        assert c.behaviour_logprobs is None


def _tail_view(tokenizer: Any, text: str, *, cut: bool, finish: str = "stop") -> CandidateView:
    ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
    if finish == "stop":
        ids = (*ids, tokenizer.eos_token_id)
    group = ScoredGroup(
        prompt="12 + 30 =",
        completions=(
            ScoredCompletion(
                text, 1.0, finish, token_ids=ids, behaviour_logprobs=tuple(-0.1 * k for k in ids)
            ),
        ),
        tokenizer_id="tok",
        producer="0xpeer",
        token_source=TokenSource.TEXT,
    )
    return CandidateView(
        group,
        model=_Model("cpu", vocab=len(tokenizer)),
        tokenizer=tokenizer,
        tokenizer_id="tok",
        add_special_tokens=False,
        cut_after_answer=cut,
    )


def test_a_completion_is_trained_only_through_its_answer_when_the_cut_is_on() -> None:
    # The tokens attack: the right answer, then a run the verifier never read (issue 23:
    # with the defences on it still reached 13 % of honest SmolLM2 completions).
    tok = _bpe()
    text = " <answer>42</answer> 12+30=42"
    view = _tail_view(tok, text, cut=True)
    assert view.cut_text(0) == " <answer>42</answer>"
    # The cut text tokenised here, stopped: answered, then done.
    cut_ids = (
        *tok(" <answer>42</answer>", add_special_tokens=False)["input_ids"],
        tok.eos_token_id,
    )
    assert view.token_ids[0] == cut_ids
    assert len(view.sent_token_ids[0]) > len(cut_ids)  # the size bound reads the whole
    assert view.behaviour_logprobs(0) is None
    trained = view.trained_group().completions[0]
    assert (trained.text, trained.finish_reason) == (view.cut_text(0), "stop")
    assert trained.reward == 1.0
    assert trained.token_ids == cut_ids
    assert trained.behaviour_logprobs is None
    assert [lp.shape[0] for lp in view.logprobs([0])] == [len(cut_ids)]  # screened as trained


def test_without_the_cut_or_without_a_tail_the_completion_is_trained_whole() -> None:
    tok = _bpe()
    off = _tail_view(tok, " <answer>42</answer> 12+30=42", cut=False)
    assert off.cut_text(0) is None
    assert off.token_ids == off.sent_token_ids
    assert off.trained_group().completions[0].text == " <answer>42</answer> 12+30=42"
    for text in (" <answer>42</answer>  \n", " 12 + 30 = 42"):  # whitespace, no tag
        on = _tail_view(tok, text, cut=True)
        assert on.cut_text(0) is None
        assert on.token_ids == on.sent_token_ids
        assert on.trained_group().completions[0].finish_reason == "stop"


def test_a_completion_is_stopped_when_sent_stopped_or_cut_after_its_answer() -> None:
    # What the length guard reads: one that ran to the producer's cap with its answer last
    # (nothing for the cut to cut) is trained without a stop token: not stopped.
    tok = _bpe()
    assert _tail_view(tok, " 12 + 30 = 42 <answer>42</answer>", cut=True).stopped(0)
    capped = _tail_view(tok, " 12 + 30 = 42 <answer>42</answer>", cut=True, finish="length")
    assert not capped.stopped(0)
    rambling = _tail_view(tok, " <answer>42</answer> and so on", cut=True, finish="length")
    assert rambling.stopped(0)  # the cut stops it after its answer
    assert not _tail_view(
        tok, " <answer>42</answer> and so on", cut=False, finish="length"
    ).stopped(0)
