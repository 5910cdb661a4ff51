"""A lean batched sampling loop over any Hugging Face causal LM, with a KV cache.

Owns token selection: temperature, top-k and top-p applied explicitly (never the
transformers ``generate`` defaults, whose implicit top-k 50 distorts sampling on tiny
vocabularies), seeded with a ``torch.Generator``. It calls the model's own ``forward``
(prefill once, then one token per step with its KV cache, projecting only the last
position onto the vocabulary), so it is the real model;
it only skips ``generate``'s per-step machinery, which dominates the cost for a ~1 M
parameter model (docs/learning.md, "Generation speed").

Log-probs: for every sampled token we return ``log_softmax(logits)[token]`` at
temperature 1 over the full vocabulary, i.e. the log-probability under the *policy* the
trainer optimises, not under the tempered/truncated sampling distribution. This is what
GRPO's ratio and truncated importance weights need; with temperature 1 and no top-k/top-p
the two coincide.

Never sampled: special tokens other than the stop tokens (``banned_ids``; a tiny model's
``<pad>`` and ``<unk>``, a chat model's control tokens). They print as nothing, so a
completion holding one would decode to text whose tokens are not the ones sampled, and
every receiver's token check would refuse the honest group (an outside run saw 10 of 12
honest drops for that reason). Masking them is a truncation like top-k: the recorded
log-probs stay the policy's.

Invariants:
    * no id in ``banned_ids`` is ever sampled;
    * sequences are left-padded; positions count only real tokens, so a padded row gives
      the same logits as the same row alone;
    * a finished row keeps its stop token as its last token and records nothing after it;
      finished rows leave the batch (and the KV cache), so later steps cost only live rows;
    * the same seed, weights, prompts and device give the same tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sapo_async.errors import ConfigError
from sapo_async.policy.generation.base import check_sampling
from sapo_async.wire import SamplingParams

__all__ = ["SampledBatch", "draw", "filter_logits", "inverse_cdf", "left_padded", "sample_batch"]


def left_padded(
    prompts: Sequence[Sequence[int]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``prompts`` left-padded with ``pad`` on ``device``: ids, attention mask, and position
    ids counting from each prompt's first token (so a prompt's last token sits in the last
    column, where its continuation starts)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp_min(0)


@dataclass(frozen=True, slots=True)
class SampledBatch:
    """Raw sampling output, one entry per row (prompt-major: prompt i's n rows are
    ``i*n .. i*n+n-1``).

    Attributes:
        token_ids: sampled ids per row, including the stop token when one was sampled.
        logprobs: temperature-1 log-probs of those ids.
        finish_reasons: ``"stop"`` or ``"length"`` per row.
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Apply temperature, then top-k (0 = off), then top-p (1 = off) to ``[rows, vocab]``
    logits; removed entries become ``-inf``."""
    out = logits / sampling.temperature if sampling.temperature != 1.0 else logits
    vocab = out.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(out, sampling.top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``[rows, vocab]`` probabilities, by inverse CDF: one uniform
    per row, found in the row's running sum (float64, so rounding moves no mass between
    tokens at a 49k vocabulary).

    Exact sampling from each row's distribution, like ``torch.multinomial(probs, 1)``, but
    ``multinomial`` draws one exponential per vocabulary entry (786 k per step at 16 rows
    of SmolLM2's vocabulary): it took 16 % of a table-size generation on these CPUs, the
    cumulative sum takes 0.7 ms a step. A zero-probability entry is never drawn: ``u`` is
    scaled by the row's total, so it lies below the last sum, and the search returns the
    first entry whose running sum exceeds it, which adds mass.
    """
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    u = torch.rand(
        (probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device
    )
    return inverse_cdf(cdf, u)


def inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The entry of each row of running sums ``cdf`` that ``u`` in [0, 1) (``[rows, 1]``)
    falls in, scaled by the row's total: the first whose sum exceeds ``u * total``.

    ``u * total`` is kept strictly below the total (rounding could reach it when ``u`` is
    within 2^-53 of 1), so the entry found always has mass of its own."""
    total = cdf[:, -1:]
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)


def _forward_kwargs(model: Any) -> tuple[str, dict[str, Any]]:
    """The cache keyword ``model.forward`` takes, and extras every call passes.

    transformers >= 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns).
    ``logits_to_keep`` projects only the last position onto the vocabulary: sampling
    needs no other, and at a 152k vocabulary the prefill's logits for every prompt token
    cost more than the layers (a 0.5B model spends ~136 M multiply-adds per position in
    the head alone). :func:`_forward` passes it as a position *index*, not as ``1``: the
    slice ``1`` makes is a strided view of the prefill's hidden states, and
    torch's matmul of a strided 3-d input expands the head's weight per row and copies it
    (SmolLM2: 4 x 576 x 49,152 values, 256 ms of a 2.9 s table-size generation; the
    indexed copy of the last position takes microseconds).
    """
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values", {}
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    return ("cache" if "cache" in params else "past_key_values"), extra


def _forward(
    model: Any,
    *,
    ids: torch.Tensor,
    mask: torch.Tensor,
    pos: torch.Tensor,
    past: Any,
    kw: tuple[str, dict[str, Any]],
) -> tuple[torch.Tensor, Any]:
    name, extra = kw
    if extra.get("logits_to_keep") == 1:  # the last position, as a contiguous [rows, 1, hidden]
        extra = {"logits_to_keep": torch.tensor([ids.shape[-1] - 1], device=ids.device)}
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        **{name: past},
        **extra,
    )
    cache = out.cache if name == "cache" else out.past_key_values
    return out.logits[:, -1, :], cache


@torch.inference_mode()
def sample_batch(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    n: int,
    stop_ids: Sequence[int],
    pad_id: int,
    seed: int,
    device: torch.device | str = "cpu",
    banned_ids: Sequence[int] = (),
) -> SampledBatch:
    """Sample ``n`` completions for each prompt in one batch.

    Args:
        model: a transformers causal LM (called through its ``forward``).
        prompt_ids: token ids of each prompt (non-empty).
        sampling: temperature, top_p, top_k, max_new_tokens.
        n: completions per prompt.
        stop_ids: ids that end a completion (EOS and friends).
        pad_id: id used for left padding and for rows that already stopped.
        seed: seed of the sampling generator.
        device: where the model lives.
        banned_ids: ids never sampled (non-stop special tokens; see the module docstring).

    Returns:
        The sampled ids, their temperature-1 log-probs and finish reasons.

    Raises:
        ConfigError: bad sampling parameters, ``n < 1``, or an empty prompt.
    """
    check_sampling(sampling)
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}", field="n")
    if any(len(p) == 0 for p in prompt_ids):
        raise ConfigError("every prompt needs at least one token", field="prompts")
    device = torch.device(device)
    # Prefill each distinct prompt once, then copy its KV cache to its n rows: the prompt
    # is the longest part of a tiny-model sequence, so this saves most prefill compute.
    ids, mask, pos = left_padded(prompt_ids, pad_id, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
    banned = torch.tensor(sorted(set(banned_ids) - set(stop_ids)), dtype=torch.long, device=device)

    kw = _forward_kwargs(model)
    logits, past = _forward(model, ids=ids, mask=mask, pos=pos, past=None, kw=kw)
    if n > 1:
        expand = torch.arange(len(prompt_ids), device=device).repeat_interleave(n)
        past.reorder_cache(expand)
        logits, mask, pos = logits[expand], mask[expand], pos[expand]
    next_pos = pos[:, -1:] + 1
    batch = len(prompt_ids) * n
    max_new = sampling.max_new_tokens
    out_ids = torch.full((batch, max_new), pad_id, dtype=torch.long, device=device)
    out_lp = torch.zeros((batch, max_new), dtype=torch.float32, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)  # original row of each live batch row
    for step in range(max_new):
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        filtered = filter_logits(logits, sampling)
        if banned.numel():
            filtered = filtered.index_fill(-1, banned[banned < filtered.shape[-1]], float("-inf"))
        probs = torch.softmax(filtered, dim=-1)
        token = draw(probs, gen)
        out_ids[rows, step] = token
        out_lp[rows, step] = logp.gather(-1, token[:, None]).squeeze(-1)
        lengths[rows] += 1
        stopped = torch.isin(token, stop)
        if bool(stopped.all()) or step == max_new - 1:
            break
        if bool(stopped.any()):
            # Drop finished rows from the batch and the KV cache: later steps only pay
            # for rows still generating.
            keep = (~stopped).nonzero().squeeze(-1)
            past.reorder_cache(keep)
            rows, token, mask, next_pos = rows[keep], token[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        logits, past = _forward(
            model, ids=token[:, None], mask=mask, pos=next_pos, past=past, kw=kw
        )
        next_pos = next_pos + 1

    all_ids = out_ids.tolist()
    all_lp = out_lp.tolist()
    live = lengths.tolist()
    stop_set = set(stop.tolist())
    token_ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    reasons: list[str] = []
    for i in range(batch):
        k = int(live[i])
        token_ids.append(all_ids[i][:k])
        logprobs.append(all_lp[i][:k])
        reasons.append("stop" if k and all_ids[i][k - 1] in stop_set else "length")
    return SampledBatch(token_ids=token_ids, logprobs=logprobs, finish_reasons=reasons)
