"""Per-token log-probs of token sequences under this node's own current model.

Owns the one no-grad forward pass the round spends on external completions: a prompt's ids
and several completions' ids (already the receiver's own tokenisation: :mod:`.view` makes
it once), right-padded into one batch on the model's device, run under
``torch.inference_mode``. Used by the candidate view (:mod:`.view`) for the defences and
the ratio filter, never by the trainer (policy/grpo has its own log-prob path inside the
gradient step).

Deliberately does not decide anything: it returns tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["token_logprobs_batch"]


def token_logprobs_batch(
    model: Any, prompt_ids: Sequence[int], rows: Sequence[Sequence[int]], *, pad: int
) -> list[Any]:
    """Log-probs of each row's tokens given ``prompt_ids``, in one batched forward pass.

    Args:
        model: a causal LM (its current weights; no gradient is taken).
        prompt_ids: the prompt's ids.
        rows: completions' ids (each non-empty).
        pad: the padding id (masked out).

    Returns:
        One 1-D float tensor per row, on the model's device, one entry per token.
    """
    import torch

    if not rows:
        return []
    device = next(model.parameters()).device
    width = len(prompt_ids) + max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        seq = [*prompt_ids, *row]
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[b, : len(seq)] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        token_lp = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    start = len(prompt_ids) - 1  # the position predicting the first completion token
    return [token_lp[b, start : start + len(row)] for b, row in enumerate(rows)]
