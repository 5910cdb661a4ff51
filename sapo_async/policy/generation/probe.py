"""The weight-sync probe: does the generation engine score a fixed sequence like the trainer?

Owns the backend-agnostic half of the check that guards every in-memory weight sync:
computing the trainer's per-token log-probs of a token sequence with a torch causal LM,
and comparing two log-prob vectors. The engine's half (asking vLLM for prompt log-probs)
lives in the backend; this module never imports vLLM.

Why a probe: colocated engines are known to fail silently (weights not synced after
sleep/wake, gibberish after a level-2 sleep without reload). A sync is verified, not
assumed: after it, the engine's log-probs of :data:`PROBE_TEXT` must match the trainer's
within :data:`~sapo_async.limits.PROBE_MAX_LOGPROB_DIFF` (mean absolute difference).

Invariants:
    * log-probs are temperature-1 log-softmax of the model's logits (vLLM's default
      ``raw_logprobs`` mode), one per token after the first, position ``i`` scoring token
      ``i + 1`` given tokens ``0..i``;
    * :func:`causal_lm_token_logprobs` leaves the model's training mode and gradients as
      it found them;
    * :func:`compare_logprobs` never passes a comparison containing NaN or infinity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sapo_async.errors import GenerationError, WeightSyncError
from sapo_async.limits import PROBE_MAX_LOGPROB_DIFF

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "PROBE_TEXT",
    "ProbeResult",
    "causal_lm_token_logprobs",
    "check_probe",
    "compare_logprobs",
]

PROBE_TEXT = (
    "Question: what is 17 + 25? Think step by step, then answer.\n"
    "<think>17 + 25 = 17 + 20 + 5 = 37 + 5 = 42.</think>\n<answer>42</answer>"
)
"""The fixed probe sequence: short (tens of tokens, so the probe costs one small forward
pass) and shaped like the completions the node trains on, so the probed positions sit in
the regime that matters rather than on improbable tokens where bf16 noise is largest."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one probe.

    Attributes:
        mean_abs_diff: mean over positions of ``|engine - trainer|`` log-prob.
        max_abs_diff: the largest single-position difference.
        n_tokens: number of positions compared.
        threshold: the allowed maximum of ``mean_abs_diff``.
    """

    mean_abs_diff: float
    max_abs_diff: float
    n_tokens: int
    threshold: float

    @property
    def ok(self) -> bool:
        """Whether the engine agrees with the trainer within the threshold."""
        return self.mean_abs_diff <= self.threshold


def compare_logprobs(
    engine: Sequence[float],
    trainer: Sequence[float],
    *,
    threshold: float = PROBE_MAX_LOGPROB_DIFF,
) -> ProbeResult:
    """Compare the engine's log-probs of a sequence with the trainer's.

    Args:
        engine: per-position log-probs reported by the generation engine.
        trainer: per-position log-probs computed by the trainer, same positions.
        threshold: allowed mean absolute difference (> 0).

    Returns:
        The measured :class:`ProbeResult`; a non-finite value on either side gives an
        infinite mismatch (so the result is never ``ok``).

    Raises:
        ValueError: lengths differ, the vectors are empty, or ``threshold`` is not > 0.
    """
    if not threshold > 0:
        raise ValueError(f"probe threshold must be > 0, got {threshold!r}")
    if len(engine) != len(trainer):
        raise ValueError(
            f"probe vectors differ in length: engine {len(engine)}, trainer {len(trainer)}"
        )
    if not engine:
        raise ValueError("probe vectors are empty: the probe sequence needs >= 2 tokens")
    diffs = [abs(float(e) - float(t)) for e, t in zip(engine, trainer, strict=True)]
    if not all(math.isfinite(d) for d in diffs):
        # NaN compares False with everything: turn it into a mismatch that cannot pass.
        return ProbeResult(math.inf, math.inf, len(diffs), threshold)
    return ProbeResult(sum(diffs) / len(diffs), max(diffs), len(diffs), threshold)


def check_probe(result: ProbeResult) -> ProbeResult:
    """Return ``result`` if it passed.

    Raises:
        WeightSyncError: the mismatch exceeds the threshold (carries both numbers).
    """
    if not result.ok:
        raise WeightSyncError(result.mean_abs_diff, result.threshold)
    return result


def causal_lm_token_logprobs(model: Any, token_ids: Sequence[int]) -> list[float]:
    """Per-token log-probs of ``token_ids`` under a torch causal LM (the trainer's view).

    Args:
        model: a ``torch.nn.Module`` called as ``model(input_ids=...)`` returning an object
            with ``.logits`` of shape ``(1, len(token_ids), vocab)`` (any transformers
            ``*ForCausalLM``).
        token_ids: the sequence (at least 2 tokens).

    Returns:
        ``len(token_ids) - 1`` floats: log-prob of token ``i + 1`` given tokens ``0..i``,
        computed in float32 from the model's logits at temperature 1.

    Raises:
        GenerationError: the sequence is shorter than 2 tokens or the model's output has
            the wrong shape.
    """
    import torch

    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        raise GenerationError(f"probe sequence needs >= 2 tokens, got {len(ids)}")
    device = _module_device(model)
    was_training = bool(model.training)
    model.eval()  # dropout off: the engine never applies it
    try:
        with torch.inference_mode():
            input_ids = torch.tensor([ids], dtype=torch.long, device=device)
            logits = model(input_ids=input_ids).logits
            if logits.dim() != 3 or logits.shape[:2] != (1, len(ids)):
                raise GenerationError(
                    f"model returned logits of shape {tuple(logits.shape)}, "
                    f"expected (1, {len(ids)}, vocab)"
                )
            logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
            picked = logprobs.gather(1, input_ids[0, 1:].unsqueeze(1)).squeeze(1)
            return [float(x) for x in picked.cpu().tolist()]
    finally:
        model.train(was_training)


def _module_device(model: Any) -> torch.device:
    import torch

    for parameter in model.parameters():
        return parameter.device  # type: ignore[no-any-return]
    return torch.device("cpu")
