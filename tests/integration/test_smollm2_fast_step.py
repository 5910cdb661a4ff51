"""The fast paths of the GRPO step (issue 56) on SmolLM2-135M-Instruct itself, a few tokens
of two chat prompts: ``trainer.share_prompts`` equals the padded step to float32 rounding,
and ``trainer.bf16`` stays within the tolerances ``tests/unit/test_grpo_bf16.py`` states
and justifies (the unit tests hold the same on the tiny reference model; a 30-block model
with a 49k vocabulary is where rounding could add up).

Why these bounds: :data:`SHARED_LOGP_ATOL` is float32 rounding through 30 blocks in another
batching (measured 2e-5 at most); a wrong position, mask or cache moves a log-prob by more
than 0.1. The bf16 bounds are the unit tests' (measured here: mean |delta log-prob| 0.028
padded and 0.039 shared, gradient 5.8% and 6.7% relative).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sapo_async.node.plausibility import token_logprobs_batch
from sapo_async.policy.grpo import Trainer, TrainerConfig
from sapo_async.policy.grpo.batch import Row
from sapo_async.policy.grpo.logprobs import cpu_bf16, token_logprobs
from sapo_async.policy.models import load_model
from tests.unit.test_grpo_bf16 import BF16_GRAD_RTOL, BF16_LOGP_ATOL
from tests.unit.test_plausibility import padded_reference

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SHARED_LOGP_ATOL = 1e-4
SHARED_GRAD_RTOL = 1e-4

_QUESTIONS = {
    "What is 17 + 25?": ["The answer is 42, since 17 + 25 = 42.", "17 + 25 = 43"],
    "What is 9 times 8?": ["9 times 8 is 72. So the answer is 72.", "It is 72"],
}


@pytest.fixture(scope="module")
def smol() -> tuple[Any, Any]:
    loaded = load_model("smollm2-135m")
    tok, model = loaded.tokenizer, loaded.model
    trainer = Trainer(model, tok, TrainerConfig(), add_special_tokens=False)
    rows = []
    for question, answers in _QUESTIONS.items():
        text = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        for k, answer in enumerate(answers):
            completion = tok(answer, add_special_tokens=False)["input_ids"]
            rows.append(Row(list(prompt), completion, None, 1.0 - 2.0 * k))
    model.train()
    return model, trainer._batcher.collate(rows, torch.device("cpu"))


def _run(model: Any, batch: Any, *, bf16: bool, share: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion log-probs and the gradient of ``sum(A x logp)`` over every parameter."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = token_logprobs(model, batch, share_prompts=share)
    (logp * batch.adv[:, None]).sum().backward()
    grad = torch.cat([p.grad.flatten().double() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return logp.detach()[batch.comp_mask.bool()], grad


def test_shared_prompts_equal_the_padded_step_on_smollm2(smol: tuple[Any, Any]) -> None:
    model, batch = smol
    padded, padded_grad = _run(model, batch, bf16=False, share=False)
    shared, shared_grad = _run(model, batch, bf16=False, share=True)
    assert float((shared - padded).abs().max()) <= SHARED_LOGP_ATOL
    assert float((shared_grad - padded_grad).norm()) <= SHARED_GRAD_RTOL * float(padded_grad.norm())


@pytest.mark.skipif(not cpu_bf16(), reason="no bf16 instructions on this CPU")
@pytest.mark.parametrize("share", [False, True], ids=["padded", "shared"])
def test_the_bf16_step_stays_near_float32_on_smollm2(smol: tuple[Any, Any], share: bool) -> None:
    model, batch = smol
    exact, exact_grad = _run(model, batch, bf16=False, share=False)
    low, low_grad = _run(model, batch, bf16=True, share=share)
    delta = (low - exact).abs()
    assert float(delta.mean()) <= BF16_LOGP_ATOL
    assert float((low_grad - exact_grad).norm()) <= BF16_GRAD_RTOL * float(exact_grad.norm())


def test_the_candidate_views_logprobs_equal_the_padded_forward_on_smollm2(
    smol: tuple[Any, Any],
) -> None:
    # the view's path (prompt once, head at completion positions) on each prompt's rows
    model, batch = smol
    model.eval()
    try:
        for start in range(0, batch.ids.shape[0], 2):  # two rows per prompt
            where = batch.comp_mask[start].bool()
            first = int(where.nonzero()[0]) + 1  # the prompt's length
            prompt = batch.ids[start, :first].tolist()
            rows = [
                batch.ids[b, first : first + int(batch.comp_mask[b].sum())].tolist()
                for b in (start, start + 1)
            ]
            got = token_logprobs_batch(model, prompt, rows, pad=0)
            want = padded_reference(model, prompt, rows, 0)
            for g, w in zip(got, want, strict=True):
                assert float((g - w).abs().max()) <= SHARED_LOGP_ATOL
    finally:
        model.train()
