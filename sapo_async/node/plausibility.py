"""Per-token log-probs of token sequences under this node's own current model.

Owns the one no-grad forward pass the round spends on external completions: a prompt's ids
and several completions' ids (already the receiver's own tokenisation: :mod:`.view` makes
it once), run under ``torch.inference_mode``. Used by the candidate view (:mod:`.view`) for
the defences and the ratio filter, never by the trainer (policy/grpo has its own log-prob
path inside the gradient step).

It runs the trainer's log-prob computation (:func:`~sapo_async.policy.grpo.logprobs.token_logprobs`
with ``share_prompts``): the prompt once and every completion after its KV cache, and the
vocabulary head only at the positions that predict a completion token. It used to run the
prompt once per completion and project every position, prompt included, onto the whole
vocabulary (SmolLM2 at the real-model table's sizes: about 150 prompt tokens before 32
completion tokens, so about 3x the arithmetic; bench/results/real.json). The values are
the padded forward's up to float rounding (``tests/unit/test_plausibility.py`` holds them to
it), far below what any check reads: the plausibility floor is calibrated in nats from this
node's own completions, and a rounding difference of 1e-5 nats moves no verdict.

Where the node's trainer runs bf16 autocast (``trainer.bf16``, "auto": a real model on a
CPU with bf16 instructions), so does the view: the floor it is compared with is calibrated
from the node's own behaviour log-probs, which come from the sampler's bf16 copy there, so
float32 bought no consistency, and at the real-model table's sizes the view was the round's
second-largest stage (bench/results/real.json). bf16 moves log-probs by about 0.03 nats on
average (the bound ``tests/unit/test_grpo_bf16.py`` holds the trainer to, and the probe's
for a bf16 engine), against a floor set 1 nat below the own completions' 1 % quantile.

Deliberately does not decide anything: it returns tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sapo_async.node.token_test import CompletionTest, completion_test, token_stats

__all__ = ["token_logprobs_batch", "token_tests_batch"]


def token_logprobs_batch(
    model: Any,
    prompt_ids: Sequence[int],
    rows: Sequence[Sequence[int]],
    *,
    pad: int,
    bf16: bool = False,
) -> list[Any]:
    """Log-probs of each row's tokens given ``prompt_ids``, in one batched pass.

    Args:
        model: a causal LM (its current weights; no gradient is taken).
        prompt_ids: the prompt's ids (non-empty).
        rows: completions' ids (each non-empty).
        pad: the padding id (masked out).
        bf16: run under bfloat16 autocast, as the node's trainer does where bf16 is fast
            (``Trainer.bf16``); the log-probs stay float32.

    Returns:
        One 1-D float32 tensor per row, on the model's device, one entry per token.
    """
    import torch

    from sapo_async.policy.grpo.batch import Row, collate
    from sapo_async.policy.grpo.logprobs import bf16_autocast, token_logprobs

    if not rows:
        return []
    device = next(model.parameters()).device
    p = len(prompt_ids)
    batch = collate([Row(list(prompt_ids), list(r), None, 0.0) for r in rows], device, pad=pad)
    with torch.inference_mode(), bf16_autocast(device, enabled=bf16):
        logp, _ = token_logprobs(model, batch, share_prompts=True)
    return [logp[b, p - 1 : p - 1 + len(row)] for b, row in enumerate(rows)]


def token_tests_batch(
    model: Any,
    prompt_ids: Sequence[int],
    rows: Sequence[Sequence[int]],
    *,
    pad: int,
    bf16: bool = False,
    tested: Sequence[int] | None = None,
    temperature: float = 1.0,
) -> list[tuple[Any, CompletionTest]]:
    """Each row's log-probs (as :func:`token_logprobs_batch`) and its per-token test
    (:mod:`.token_test`) under this node's policy, from one batched pass: the logits that
    predict a row's tokens are made once, a row at a time, for both. ``tested``: how many
    of each row's first tokens the test reads (default all; a stop token the receiver
    appended, which the peer never sampled, is not evidence about its sampling).
    ``temperature``: the swarm's sampling temperature, the test's null (the log-probs stay
    the policy's own); a nucleus below 1 only makes the test conservative (a truncated
    sample's tokens are likelier than the whole distribution's)."""
    import torch

    from sapo_async.policy.grpo.batch import Row, collate
    from sapo_async.policy.grpo.logprobs import bf16_autocast, completion_hidden

    if not rows:
        return []
    device = next(model.parameters()).device
    batch = collate([Row(list(prompt_ids), list(r), None, 0.0) for r in rows], device, pad=pad)
    out, start = [], 0
    with torch.inference_mode(), bf16_autocast(device, enabled=bf16):
        hidden, project, targets = completion_hidden(model, batch, share_prompts=True)
        for j, row in enumerate(rows):
            h, t = hidden[start : start + len(row)], targets[start : start + len(row)]
            start += len(row)
            logits = project(h).float()
            logp = logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)
            k = len(row) if tested is None else tested[j]
            null = logits[:k] / temperature
            out.append((logp, completion_test(token_stats(null, t[:k]))))
    return out
