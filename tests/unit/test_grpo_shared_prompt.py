"""``trainer.share_prompts``: each distinct prompt of a batch runs once, its completions
after its KV cache, and the step is the padded step's up to float rounding.

Held three ways: in float64 the step reproduces the recorded reference of
``test_grpo_reference.py`` within its 1e-6 (so the shared forward computes the same
function, and the L rows' gradients reach the one prompt pass); in float32 the log-probs
and gradients equal the padded path's to float32 rounding (the bounds below); and the
decoder really sees fewer positions, one prompt per group. Where sharing cannot help or
cannot be trusted, the padded forward runs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sapo_async.policy.grpo import Trainer, TrainerConfig
from sapo_async.policy.grpo.logprobs import token_logprobs
from sapo_async.policy.grpo.shared_prompt import shared_prompt_hidden
from tests.unit.test_grpo_reference import (
    CASES,
    _assert_matches,
    _model,
    _reference,
    _tokenizer,
    groups,
    loss_and_grads,
)

F32_LOGP_ATOL = 1e-5
"""Float32 rounding: log-probs of about -4 carry ~5e-7 of it per operation, and two layers
of attention, MLP and a 16-wide logsumexp in another batching reach a few 1e-7; 1e-5 is
well above that and far below any real change (a wrong position or mask moves log-probs by
more than 0.1)."""
F32_GRAD_RTOL = 1e-4
"""Gradients summed over the group's rows in another order: relative float32 rounding of
~1e-6 per term over a few hundred terms; 1e-4 of the gradient's norm bounds it."""


def _batch(dtype: torch.dtype = torch.float64) -> tuple[Any, Any, Any]:
    tok = _tokenizer()
    model = _model(tok).to(dtype)
    trainer = Trainer(model, tok, TrainerConfig(max_completion_tokens=24), add_special_tokens=False)
    rows, _ = trainer._batcher.rows(groups(tok))
    return model, trainer._batcher.collate(rows, torch.device("cpu")), rows


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_shared_step_reproduces_the_recorded_reference(name: str) -> None:
    _assert_matches(loss_and_grads(name, share_prompts=True), _reference()[name])


def test_shared_prompts_with_micro_batches_and_small_chunks_reproduce_the_reference() -> None:
    # micro-batches of 40 padded tokens split the groups: each shares what it holds
    got = loss_and_grads(
        "dapo_tis", share_prompts=True, micro_batch_tokens=40, logprob_chunk_tokens=5
    )
    _assert_matches(got, _reference()["dapo_tis"])


def test_the_decoder_runs_each_prompt_once() -> None:
    model, batch, rows = _batch()
    seen: list[int] = []
    model.model.embed_tokens.register_forward_hook(lambda _m, a, _o: seen.append(a[0].numel()))
    token_logprobs(model, batch, share_prompts=True)
    prompts = {tuple(r.prompt) for r in rows}
    longest_prompt = max(len(r.prompt) for r in rows)
    longest_completion = max(len(r.completion) for r in rows)
    assert seen == [len(prompts) * longest_prompt, len(rows) * longest_completion]
    assert sum(seen) < batch.ids.numel()  # the padded forward's positions
    seen.clear()
    token_logprobs(model, batch)  # the switch off: the padded forward, as before
    assert seen == [batch.ids.numel()]


def test_float32_log_probs_and_gradients_equal_the_padded_path_to_rounding() -> None:
    model, batch, _ = _batch(torch.float32)

    def run(share: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, batch, share_prompts=share)
        (logp * batch.adv[:, None]).sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.parameters()]

    padded, padded_grads = run(False)
    shared, shared_grads = run(True)
    assert float((padded - shared).abs().max()) <= F32_LOGP_ATOL
    for a, b in zip(padded_grads, shared_grads, strict=True):
        assert float((a - b).norm()) <= F32_GRAD_RTOL * float(a.norm()) + 1e-12


def test_no_repeated_prompt_or_activation_checkpointing_runs_the_padded_forward() -> None:
    model, batch, rows = _batch()
    first = [i for i, r in enumerate(rows) if r.prompt != rows[i - 1].prompt or i == 0]
    one_each = type(batch)(
        ids=batch.ids[first],
        attn=batch.attn[first],
        comp_mask=batch.comp_mask[first],
        adv=batch.adv[first],
        behaviour=batch.behaviour[first],
        has_behaviour=batch.has_behaviour[first],
    )
    assert shared_prompt_hidden(model.model, one_each) is None
    assert shared_prompt_hidden(model.model, batch) is not None
    tok = _tokenizer()
    Trainer(model, tok, TrainerConfig(gradient_checkpointing=True), add_special_tokens=False)
    assert shared_prompt_hidden(model.model, batch) is None


def test_a_row_not_laid_out_prompt_then_completion_runs_the_padded_forward() -> None:
    model, batch, _ = _batch()
    holed = batch.comp_mask.clone()
    row = int(holed.sum(-1).argmax())
    on = holed[row].nonzero().squeeze(-1)
    holed[row, on[1]] = 0  # a completion mask with a hole
    batch.comp_mask = holed
    assert shared_prompt_hidden(model.model, batch) is None


def test_sharing_is_auto_and_off_for_the_tiny_model() -> None:
    # on from FAST_PATH_MIN_PARAMS (test_grpo_bf16.py); the reference model is far below
    model, _, _ = _batch()
    assert TrainerConfig().share_prompts == "auto"
    assert Trainer(model, _tokenizer(), TrainerConfig()).share_prompts is False
