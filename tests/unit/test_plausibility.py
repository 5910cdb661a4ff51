"""The candidate view's log-probs (``node/plausibility.py``): the prompt run once, the head
only where a completion token is predicted, and the values the padded full-vocabulary
forward gives (the path it replaced, kept here as the reference), to float32 rounding."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sapo_async.node.judge import candidate_view
from sapo_async.node.plausibility import token_logprobs_batch
from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup, TokenSource
from sapo_async.policy.grpo.logprobs import cpu_bf16
from sapo_async.policy.models import tokenizer_id
from tests.fixtures.selection import SAMPLING
from tests.unit.test_grpo_bf16 import BF16_LOGP_ATOL
from tests.unit.test_grpo_reference import _model, _tokenizer

AUTOCAST_SEEN = 1e-4
"""Below this mean change the view did not run in bf16 at all (float32 rounding: ~1e-7)."""

F32_LOGP_ATOL = 1e-5
"""As ``test_grpo_shared_prompt.F32_LOGP_ATOL``: float32 rounding through two blocks in
another batching is a few 1e-7; a wrong position, mask or cache moves a log-prob by more
than 0.1."""


def padded_reference(
    model: Any, prompt: list[int], rows: list[list[int]], pad: int
) -> list[torch.Tensor]:
    """The path before: every row padded to prompt + completion, full logits everywhere."""
    width = len(prompt) + max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(prompt) + len(row)] = torch.tensor([*prompt, *row])
        mask[b, : len(prompt) + len(row)] = 1
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    start = len(prompt) - 1
    return [logp[b, start : start + len(r)] for b, r in enumerate(rows)]


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tok = _tokenizer()
    return tok, _model(tok).to(torch.float32).eval()


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("n_rows", [1, 2, 5])
def test_the_view_equals_the_padded_full_vocabulary_forward(tiny: Any, n_rows: int) -> None:
    tok, model = tiny
    prompt = _ids(tok, "what is 3 + 4 ?")
    texts = ["7", "it is 7 because 3 + 4 = 7", "8 ?", "3 + 4 is 7", "seven"][:n_rows]
    rows = [[*_ids(tok, t), tok.eos_token_id] for t in texts]
    got = token_logprobs_batch(model, prompt, rows, pad=tok.pad_token_id)
    want = padded_reference(model, prompt, rows, tok.pad_token_id)
    assert [g.shape for g in got] == [(len(r),) for r in rows]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, atol=F32_LOGP_ATOL, rtol=0)


def test_the_prompt_runs_once_and_the_head_sees_only_completion_positions(tiny: Any) -> None:
    tok, model = tiny
    prompt = _ids(tok, "what is 3 + 4 ?")
    rows = [_ids(tok, "7"), _ids(tok, "it is 7"), _ids(tok, "3 + 4 = 7")]
    seen: dict[str, list[int]] = {"decoder": [], "head": []}
    hooks = [
        model.base_model.register_forward_hook(
            lambda _m, _a, kw, out: seen["decoder"].append(int(kw["input_ids"].numel())),
            with_kwargs=True,
        ),
        model.get_output_embeddings().register_forward_hook(
            lambda _m, args, _out: seen["head"].append(int(args[0].shape[0]))
        ),
    ]
    try:
        token_logprobs_batch(model, prompt, rows, pad=tok.pad_token_id)
    finally:
        for h in hooks:
            h.remove()
    longest = max(len(r) for r in rows)
    # one prompt pass, then each row's completion after it (never prompt + completion per row)
    assert seen["decoder"] == [len(prompt), len(rows) * longest]
    assert sum(seen["head"]) == sum(len(r) for r in rows)


def test_no_rows_is_no_pass(tiny: Any) -> None:
    tok, model = tiny
    assert token_logprobs_batch(model, _ids(tok, "3 + 4"), [], pad=tok.pad_token_id) == []


@pytest.mark.skipif(not cpu_bf16(), reason="no bf16 instructions on this CPU")
def test_the_view_runs_in_the_trainers_precision(tiny: Any) -> None:
    # where the trainer runs bf16 autocast the view does (node/plausibility.py says why):
    # the log-probs stay float32, move by less than the trainer's bf16 bound, but do move
    tok, model = tiny
    learner = SimpleNamespace(
        model=model,
        tokenizer=tok,
        tokenizer_id=tokenizer_id(tok),
        settings=SimpleNamespace(chat_template=False, sampling=SAMPLING),
        trainer=SimpleNamespace(bf16=True),
    )
    group = ScoredGroup(
        prompt="what is 3 + 4 ?",
        completions=(
            ScoredCompletion(" it is 7 because 3 + 4 = 7", 1.0, "stop"),
            ScoredCompletion(" 8", 0.0, "stop"),
        ),
        tokenizer_id=tokenizer_id(tok),
        producer="0xpeer",
        token_source=TokenSource.TEXT,
    )
    low = candidate_view(learner, group).logprobs([0, 1])  # type: ignore[arg-type]
    learner.trainer.bf16 = False
    exact = candidate_view(learner, group).logprobs([0, 1])  # type: ignore[arg-type]
    for lo, ex in zip(low, exact, strict=True):
        assert lo.dtype == torch.float32
        delta = float((lo - ex).abs().mean())
        assert AUTOCAST_SEEN < delta <= BF16_LOGP_ATOL
