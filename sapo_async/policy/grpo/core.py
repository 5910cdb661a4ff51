"""GRPO maths as pure functions: group advantages, per-token loss, aggregation.

Owns the objective and nothing else: no model, no optimizer, no I/O. Tensors in, tensors
out; everything is unit-tested against hand-computed values.

For sequence ``i`` with advantage ``A_i`` and completion token ``t`` (mask ``m_it``)::

    r_it   = exp(logp_it - old_logp_it)                         (policy ratio)
    surr   = min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)
    w_it   = min(exp(old_logp_it - behaviour_logp_it), cap)     (truncated IS, optional;
             or one weight per sequence, min(exp(sum_t (old - behaviour)), cap))
    kl_it  = exp(ref_it - logp_it) - (ref_it - logp_it) - 1     (k3, optional, beta 0)
    l_it   = -w_it * surr + beta * kl_it

aggregated by ``grpo`` (mean over each sequence's tokens, then over sequences), ``dapo``
(sum over all tokens / number of tokens in the batch) or ``dr_grpo`` (sum over all tokens /
(number of sequences x a constant max length), Dr. GRPO's length-unbiased normaliser).

Departures from the GRPO paper (DeepSeekMath): std is the population std (ddof 0), so a
group of one completion or of equal rewards gets advantages of exactly zero instead of NaN;
the asymmetric clip (0.2 / 0.28) is DAPO's "clip-higher", as SAPO uses; no KL by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from sapo_async.errors import ConfigError

__all__ = [
    "ADVANTAGE_MODES",
    "AGGREGATIONS",
    "TIS_LEVELS",
    "AdvantageMode",
    "Aggregation",
    "LossTerms",
    "TisLevel",
    "aggregate",
    "group_advantages",
    "k3_kl",
    "policy_loss",
    "truncated_is_weights",
]

Aggregation = Literal["grpo", "dapo", "dr_grpo"]
AdvantageMode = Literal["std", "mean"]
TisLevel = Literal["token", "sequence"]
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
AGGREGATIONS: tuple[str, ...] = ("grpo", "dapo", "dr_grpo")
ADVANTAGE_MODES: tuple[str, ...] = ("std", "mean")


def group_advantages(
    rewards: Sequence[float], *, mode: AdvantageMode = "std", eps: float = 1e-6
) -> list[float]:
    """Advantages of one group's completions.

    Args:
        rewards: the group's rewards.
        mode: ``"std"`` for ``(r - mean) / (std + eps)``, ``"mean"`` for ``r - mean``
            (Dr. GRPO's unscaled variant).
        eps: added to the std so tiny spreads do not explode.

    Returns:
        One advantage per reward; all zeros when every reward is equal within 1e-9
        (including a group of one).

    Raises:
        ConfigError: unknown mode, empty group, or a non-finite reward.
    """
    if mode not in ADVANTAGE_MODES:
        raise ConfigError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    if not rewards:
        raise ConfigError("a group needs at least one reward", field="rewards")
    if not all(math.isfinite(r) for r in rewards):
        raise ConfigError(f"rewards must be finite, got {list(rewards)}", field="rewards")
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if max(rewards) - min(rewards) <= 1e-9:
        return [0.0] * len(rewards)
    if mode == "mean":
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(rewards))
    return [c / (std + eps) for c in centred]


def truncated_is_weights(
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    available: torch.Tensor,
    cap: float,
    *,
    level: TisLevel = "token",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Truncated importance weights of the update policy over the behaviour policy.

    ``token``: ``min(exp(old_t - behaviour_t), cap)`` per token (TRL's ``token_truncate``).
    ``sequence``: one weight per sequence, ``min(exp(sum_t m_t (old_t - behaviour_t)), cap)``,
    the product of its tokens' ratios, given to every token (TRL's ``sequence_truncate``).

    Args:
        old_logp: ``[B, T]`` log-probs of the sampled tokens under the policy being updated
            (before this step).
        behaviour_logp: ``[B, T]`` log-probs under the policy that generated them.
        available: ``[B]`` bool, rows whose behaviour log-probs are known; other rows get 1.
        cap: truncation (e.g. 2.0).
        level: ``"token"`` or ``"sequence"``.
        mask: ``[B, T]`` 1 on completion tokens (needed for ``"sequence"``).

    Returns:
        ``[B, T]`` weights, detached.

    Raises:
        ConfigError: ``cap <= 0``, an unknown level, or ``"sequence"`` without a mask.
    """
    if cap <= 0:
        raise ConfigError(f"importance-weight cap must be > 0, got {cap}", field="tis_cap")
    if level not in TIS_LEVELS:
        raise ConfigError(
            f"tis_level must be one of {TIS_LEVELS}, got {level!r}", field="tis_level"
        )
    log_ratio = (old_logp - behaviour_logp).detach()
    if level == "sequence":
        if mask is None:
            raise ConfigError("sequence-level importance weights need the mask", field="tis_level")
        seq = (log_ratio * mask.to(log_ratio.dtype)).sum(-1, keepdim=True)
        w = torch.exp(seq).clamp(max=cap).expand_as(log_ratio)
    else:
        w = torch.exp(log_ratio).clamp(max=cap)
    return torch.where(available[:, None], w, torch.ones_like(w))


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference), per token (always >= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation,
    *,
    max_tokens: int | None = None,
    n_sequences: int | None = None,
    n_tokens: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token quantity to a scalar.

    When the rows are one micro-batch of a larger batch, ``n_sequences`` and ``n_tokens``
    are the whole batch's counts, and the micro-batches' results sum to the batch's.

    Args:
        per_token: the values.
        mask: ``[B, T]`` 1 on completion tokens, 0 on padding.
        mode: ``grpo`` (per-sequence mean, then mean over sequences; a sequence without
            tokens counts as 0), ``dapo`` (token mean over the batch), ``dr_grpo``
            (sum / (B x max_tokens)).
        max_tokens: the constant of ``dr_grpo`` (default ``T``).
        n_sequences: sequences in the whole batch (default ``B``).
        n_tokens: completion tokens in the whole batch (default ``mask.sum()``).

    Raises:
        ConfigError: unknown mode or ``max_tokens < 1``.
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    rows = per_token.shape[0] if n_sequences is None else n_sequences
    if mode == "grpo":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp_min(1.0)
        return per_seq.mean() if n_sequences is None else per_seq.sum() / rows
    if mode == "dapo":
        if n_tokens is None:
            return masked.sum() / mask.sum().clamp_min(1.0)
        return masked.sum() / max(n_tokens, 1.0)
    if mode == "dr_grpo":
        length = per_token.shape[-1] if max_tokens is None else max_tokens
        if length < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {length}", field="max_tokens")
        return masked.sum() / (rows * length)
    raise ConfigError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


@dataclass(frozen=True, slots=True)
class LossTerms:
    """The loss and what it is made of (diagnostics are detached floats).

    Attributes:
        loss: the scalar to backpropagate.
        clip_fraction: fraction of completion tokens where the clipped branch was taken.
        kl: mean k3 KL to the reference over completion tokens (0 without a reference).
        ratio_mean: mean policy ratio over completion tokens.
    """

    loss: torch.Tensor
    clip_fraction: float
    kl: float
    ratio_mean: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    aggregation: Aggregation = "dapo",
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    max_tokens: int | None = None,
    n_sequences: int | None = None,
    n_tokens: float | None = None,
) -> LossTerms:
    """The clipped GRPO surrogate (see the module docstring).

    Args:
        logp: ``[B, T]`` log-probs of the completion tokens under the current policy
            (carries gradient).
        old_logp: ``[B, T]`` the same under the policy before this update (no gradient).
        advantages: ``[B]`` one advantage per sequence.
        mask: ``[B, T]`` 1 on completion tokens.
        aggregation: ``grpo``, ``dapo`` or ``dr_grpo``.
        eps_low: lower clip (ratio >= 1 - eps_low).
        eps_high: upper clip (ratio <= 1 + eps_high).
        beta: k3 KL coefficient; needs ``ref_logp`` when > 0.
        ref_logp: ``[B, T]`` reference-policy log-probs.
        is_weights: ``[B, T]`` truncated importance weights (see
            :func:`truncated_is_weights`), or ``None`` for 1.
        max_tokens: ``dr_grpo``'s constant.
        n_sequences / n_tokens: the whole batch's counts when these rows are one
            micro-batch of it (see :func:`aggregate`); the diagnostics are then this
            micro-batch's share of the batch's means, so micro-batches' terms add up.

    Returns:
        The loss and diagnostics.

    Raises:
        ConfigError: shapes disagree, a clip is negative, or ``beta > 0`` without a
            reference.
    """
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ConfigError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    if advantages.shape != logp.shape[:1]:
        raise ConfigError(f"advantages must be [{logp.shape[0]}], got {tuple(advantages.shape)}")
    if eps_low < 0 or eps_high < 0:
        raise ConfigError(f"clip epsilons must be >= 0, got {eps_low}, {eps_high}", field="clip")
    if beta < 0:
        raise ConfigError(f"beta must be >= 0, got {beta}", field="beta")
    if beta > 0 and ref_logp is None:
        raise ConfigError("beta > 0 needs reference log-probs", field="beta")
    adv = advantages[:, None].to(logp.dtype)
    ratio = torch.exp(logp - old_logp.detach())
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    surr = torch.minimum(ratio * adv, clipped * adv)
    per_token = -surr if is_weights is None else -surr * is_weights.detach()
    kl_value = 0.0
    fmask = mask.to(logp.dtype)
    n_tok = fmask.sum().clamp_min(1.0) if n_tokens is None else max(n_tokens, 1.0)
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp.detach())
        kl_value = float(((kl * fmask).sum() / n_tok).detach())
        if beta > 0:
            per_token = per_token + beta * kl
    loss = aggregate(
        per_token,
        mask,
        aggregation,
        max_tokens=max_tokens,
        n_sequences=n_sequences,
        n_tokens=n_tokens,
    )
    with torch.no_grad():
        took_clip = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        clip_fraction = float((took_clip.to(logp.dtype) * fmask).sum() / n_tok)
        ratio_mean = float((ratio * fmask).sum() / n_tok)
    return LossTerms(loss=loss, clip_fraction=clip_fraction, kl=kl_value, ratio_mean=ratio_mean)
