"""The decoder's hidden states at completion positions, each distinct prompt run once.

Owns one computation for :func:`~.logprobs.token_logprobs` (``trainer.share_prompts``): the
rows of a GRPO batch are a group's L completions of one prompt, and on a chat model the
prompt is most of each row (SmolLM2 at the real-model table's sizes: about 150 prompt
tokens before 32 completion tokens, so a plain padded forward runs every prompt L times).
Here instead::

    distinct prompts, left-padded            [K, Wp]   one forward, its KV cache kept
    the cache, row i taking its prompt's      [B, ...]  (an index, so gradients of the L
                                                         rows sum into the one prompt pass)
    completions, right-padded, after it       [B, Wc]   positions continuing the prompt's
    hidden at position j predicting completion token j: the prompt's last position for
    j = 0, completion position j - 1 after it

so ``K x Wp + B x Wc`` positions go through the blocks instead of ``B x (Wp + Wc)``. The
values are those of the padded forward up to float rounding (the same products in another
batching, and the L rows' gradients summed in another order): not bit-equal, hence a
switch, off by default; ``tests/unit/test_grpo_shared_prompt.py`` holds it to the
padded path and to the recorded reference.

Returns ``None`` (the caller runs the padded forward) where it cannot help or cannot be
trusted: no prompt repeats, a row not laid out as ``[prompt][completion][padding]``, or a
model running activation checkpointing (transformers drops the KV cache there).
Deliberately knows nothing of the loss or the head.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from sapo_async.policy.generation.sampling import left_padded
from sapo_async.policy.grpo.batch import Batch

__all__ = ["shared_prompt_hidden"]


def shared_prompt_hidden(base: Any, batch: Batch) -> torch.Tensor | None:
    """Last hidden states at the positions predicting ``batch``'s completion tokens.

    Args:
        base: the decoder (a transformers ``base_model``: returns ``last_hidden_state``
            and takes a KV cache).
        batch: the padded batch (rows ``[prompt][completion][padding]``).

    Returns:
        ``[N, H]``, in the order of ``batch.comp_mask``'s ones (row by row, position by
        position), or ``None`` where the padded forward should run instead.
    """
    if _checkpointing(base):
        return None
    layout = _layout(batch)
    if layout is None:
        return None
    prompts, index, comp_lens = layout
    if len(prompts) == len(index):
        return None  # every prompt is its own: nothing to share
    device = batch.ids.device
    p_ids, p_mask, p_pos = left_padded(prompts, 0, device)
    name = _cache_keyword(base)
    out = base(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True)
    cache = getattr(out, name)
    if cache is None:
        return None
    rows = torch.tensor(index, device=device)
    cache.batch_select_indices(rows)
    c_width = max(comp_lens)
    c_ids = torch.zeros((len(index), c_width), dtype=torch.long)
    c_mask = torch.zeros((len(index), c_width), dtype=torch.long)
    where = batch.comp_mask.bool()
    targets = batch.ids[:, 1:]
    for i, n in enumerate(comp_lens):
        c_ids[i, :n] = targets[i][where[i]].cpu()
        c_mask[i, :n] = 1
    c_ids, c_mask = c_ids.to(device), c_mask.to(device)
    c_pos = p_pos[rows, -1:] + 1 + torch.arange(c_width, device=device)
    done = base(
        input_ids=c_ids,
        attention_mask=torch.cat([p_mask[rows], c_mask], dim=-1),
        position_ids=c_pos,
        use_cache=True,
        **{name: cache},
    )
    hidden = torch.cat([out.last_hidden_state[rows, -1:], done.last_hidden_state[:, :-1]], 1)
    result: torch.Tensor = hidden[c_mask.bool()]
    return result


def _layout(batch: Batch) -> tuple[list[list[int]], list[int], list[int]] | None:
    """The distinct prompts, each row's prompt index and completion length; ``None`` when a
    row is not ``[prompt][completion][padding]`` with a contiguous completion mask."""
    mask = batch.comp_mask.bool().cpu()
    attn = batch.attn.cpu().tolist()
    ids = batch.ids.cpu().tolist()
    prompts: dict[tuple[int, ...], int] = {}
    index: list[int] = []
    comp_lens: list[int] = []
    for i, row in enumerate(mask):
        on = row.nonzero().squeeze(-1).tolist()
        if not on or on[-1] - on[0] + 1 != len(on):
            return None
        prompt_len, comp_len = on[0] + 1, len(on)
        if sum(attn[i]) != prompt_len + comp_len or attn[i][: prompt_len + comp_len].count(0):
            return None
        index.append(prompts.setdefault(tuple(ids[i][:prompt_len]), len(prompts)))
        comp_lens.append(comp_len)
    return [list(p) for p in prompts], index, comp_lens


def _checkpointing(base: Any) -> bool:
    """Whether the decoder recomputes activations (transformers >= 5.2 names it
    ``is_activation_checkpointing``; the older name warns there)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(base), name) or hasattr(base, name):
            return bool(getattr(base, name))
    return False


def _cache_keyword(base: Any) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values``: the forward's keyword and
    the output's attribute."""
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"
