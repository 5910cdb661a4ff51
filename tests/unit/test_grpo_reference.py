"""Loss and gradients of one GRPO update on fixed inputs equal a recorded reference.

The reference (``tests/unit/data/grpo_reference.pt``) was recorded from the trainer as it
stood on main at commit 90985e1, before log-probs were computed on completion tokens only
and batches were split into micro-batches: that trainer took a full-vocabulary
``log_softmax`` over every position of the whole batch at once. It holds, for each of
grpo, dapo and dr_grpo with and without token-level truncated IS, the loss, the gradient
norm and the gradient of every parameter at the optimizer step (clipping off, so the raw
gradient). The current trainer must reproduce every one within 1e-6, whatever micro-batch
size or log-prob chunk it uses.

Recording (only ever from a commit whose trainer *is* the reference)::

    PYTHONPATH=. python tests/unit/test_grpo_reference.py --record
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sapo_async.policy.grpo import ScoredCompletion, ScoredGroup, Trainer, TrainerConfig
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.policy.models import tokenizer_id, train_char_tokenizer

REFERENCE = Path(__file__).parent / "data" / "grpo_reference.pt"
TOLERANCE = 1e-6

_TEXTS = [
    "What is 2 + 3? <answer>5</answer>",
    "0123456789 +-*=? abcdefghijklmnopqrstuvwxyz",
]
_MAX_TOKENS = 24
"""Below the longest completion (30 tokens), so truncation is part of the record."""


def _tokenizer() -> Any:
    return train_char_tokenizer(_TEXTS)


def _model(tok: Any) -> Any:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        attention_dropout=0.0,
    )
    torch.manual_seed(4321)
    return LlamaForCausalLM(config).double()


def _ids(tok: Any, text: str) -> tuple[int, ...]:
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


def _local_group(tok: Any, prompt: str, texts: list[str], rewards: list[float]) -> ScoredGroup:
    """A local group: our ids (EOS after each) and made-up behaviour log-probs."""
    eos = tok.eos_token_id
    comps = []
    for k, (text, reward) in enumerate(zip(texts, rewards, strict=True)):
        ids = (*_ids(tok, text), eos)
        lps = tuple(-0.3 - 0.05 * ((j * 7 + k) % 11) for j in range(len(ids)))
        comps.append(ScoredCompletion(text, reward, "stop", ids, lps))
    return ScoredGroup(
        prompt=prompt,
        prompt_token_ids=_ids(tok, prompt),
        tokenizer_id=tokenizer_id(tok),
        completions=tuple(comps),
        token_source=TokenSource.SAMPLED,
    )


def groups(tok: Any) -> list[ScoredGroup]:
    """Fixed groups: two local ones (one with a 30-token completion), a peer's text."""
    long = "<answer>5</answer> 0123456789 ab"  # 30 tokens with EOS: truncated to 24
    first = _local_group(
        tok,
        "What is 2 + 3? ",
        ["5", "<answer>5</answer>", long, "<answer>4"],
        [0.0, 1.0, 0.5, 0.0],
    )
    second = _local_group(
        tok, "What is 9 - 1? ", ["8", "<answer>8</answer>", "9 9 9"], [1.0, 1.0, 0.0]
    )
    peer = ScoredGroup(
        prompt="What is 1 + 1? ",
        tokenizer_id=tokenizer_id(tok),
        producer="0xpeer",
        completions=(
            ScoredCompletion("2", 1.0, "stop"),
            ScoredCompletion("<answer>3</answer>", 0.0, "stop"),
            ScoredCompletion("eleven eleven", 0.0, "length"),
        ),
        token_source=TokenSource.TEXT,
    )
    return [first, second, peer]


CASES: dict[str, dict[str, Any]] = {
    f"{agg}{'_tis' if tis else ''}": {"loss_type": agg, "tis_cap": tis}
    for agg in ("grpo", "dapo", "dr_grpo")
    for tis in (None, 1.2)
}


def config(name: str, **more: Any) -> TrainerConfig:
    """The case's settings: one update, clipping off (the optimizer sees the raw gradient)."""
    return TrainerConfig(
        lr=1e-3, max_grad_norm=0.0, max_completion_tokens=_MAX_TOKENS, **CASES[name], **more
    )


def loss_and_grads(name: str, **more: Any) -> dict[str, Any]:
    """One step of case ``name``: loss, grad norm, tokens, and each parameter's gradient as
    the optimizer saw it."""
    tok = _tokenizer()
    model = _model(tok)
    trainer = Trainer(model, tok, config(name, **more), add_special_tokens=False)
    names = {id(p): n for n, p in model.named_parameters()}
    seen: dict[str, torch.Tensor] = {}

    def grab(opt: Any, *_: Any) -> None:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    seen[names[id(p)]] = p.grad.detach().clone()

    trainer.optimizer.register_step_pre_hook(grab)
    m = trainer.step(groups(tok))
    assert not m.skipped
    return {
        "loss": m.loss,
        "grad_norm": m.grad_norm,
        "entropy": m.entropy,
        "tokens": m.tokens,
        "sequences": m.sequences,
        "grads": seen,
    }


def _reference() -> dict[str, Any]:
    data: dict[str, Any] = torch.load(REFERENCE, weights_only=True)
    return data


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_and_gradients_equal_the_recorded_reference(name: str) -> None:
    ref = _reference()[name]
    got = loss_and_grads(name)
    assert got["tokens"] == ref["tokens"]
    assert got["sequences"] == ref["sequences"]
    assert got["loss"] == pytest.approx(ref["loss"], abs=TOLERANCE)
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], abs=TOLERANCE)
    assert got["entropy"] == pytest.approx(ref["entropy"], abs=TOLERANCE)
    assert sorted(got["grads"]) == sorted(ref["grads"])
    for param, grad in ref["grads"].items():
        diff = float((got["grads"][param] - grad).abs().max())
        assert diff <= TOLERANCE, f"{param}: max |grad - reference| = {diff:.3g}"


def _assert_matches(got: dict[str, Any], ref: dict[str, Any], tol: float = TOLERANCE) -> None:
    assert got["tokens"] == ref["tokens"]
    assert got["loss"] == pytest.approx(ref["loss"], abs=tol)
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], abs=tol)
    assert got["entropy"] == pytest.approx(ref["entropy"], abs=tol)
    for param, grad in ref["grads"].items():
        diff = float((got["grads"][param] - grad).abs().max())
        assert diff <= tol, f"{param}: max |grad - reference| = {diff:.3g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_micro_batches_and_small_logprob_chunks_reproduce_the_reference(name: str) -> None:
    # 40 padded tokens: the 10 rows (widths 9 to 33) go in 7 micro-batches; chunks of 5
    # positions split every row's completion across chunks
    got = loss_and_grads(name, micro_batch_tokens=40, logprob_chunk_tokens=5)
    _assert_matches(got, _reference()[name])


def test_gradient_checkpointing_reproduces_the_reference() -> None:
    got = loss_and_grads("dapo_tis", gradient_checkpointing=True, micro_batch_tokens=64)
    _assert_matches(got, _reference()["dapo_tis"])


def test_the_reference_is_not_trivial() -> None:
    """The record can catch a change: losses differ across cases, TIS moves gradients,
    and the long completion was truncated to the cap."""
    ref = _reference()
    assert len({round(v["loss"], 9) for v in ref.values()}) == len(ref)
    for agg in ("grpo", "dapo", "dr_grpo"):
        plain, tis = ref[agg]["grads"], ref[f"{agg}_tis"]["grads"]
        assert any(float((plain[k] - tis[k]).abs().max()) > 1e-4 for k in plain)
        assert ref[agg]["grad_norm"] > 1e-3
    assert ref["dapo"]["sequences"] == 10
    assert ref["dapo"]["tokens"] < sum(
        len(c.text) + 1 for g in groups(_tokenizer()) for c in g.completions
    )


def _record() -> None:
    out = {name: loss_and_grads(name) for name in sorted(CASES)}
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, REFERENCE)
    for name, v in out.items():
        print(name, v["loss"], v["grad_norm"], v["tokens"], v["sequences"])


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: test_grpo_reference.py --record")
    _record()
