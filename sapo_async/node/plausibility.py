"""Per-token log-probs of other nodes' completions under this node's own model.

Owns one batched forward pass: a prompt and its completions, re-tokenised with the
receiver's tokenizer from the *text* (so peers with another tokenizer, or token ids that do
not match their text, are judged on what the trainer will see), EOS appended to completions
that stopped, as the generator and the trainer do. Used by the defences
(:mod:`.defence`), never by the trainer (policy/grpo has its own log-prob path).

Deliberately does not decide anything: it returns numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["completion_logprobs"]


def completion_logprobs(
    model: Any,
    tokenizer: Any,
    prompt: str,
    completions: Sequence[tuple[str, str]],
    *,
    add_special_tokens: bool = True,
    max_tokens: int | None = None,
) -> list[list[float]]:
    """Log-probs of each completion's tokens given ``prompt``, in one forward pass.

    Args:
        model: a causal LM (its current weights; no gradient is taken).
        tokenizer: its tokenizer.
        prompt: the prompt text as this node would show it.
        completions: (text, finish_reason) pairs.
        add_special_tokens: as the node's generator tokenises prompts.
        max_tokens: completions longer than this (re-tokenised) are not run through the
            model; their list has this length + 1 of zeros (the caller's length guard
            refuses them without spending a forward pass on them).

    Returns:
        One list of per-token log-probs per completion (EOS included for ``"stop"``).
    """
    import torch

    prompt_ids = list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    eos = tokenizer.eos_token_id
    rows: list[list[int]] = []
    for text, finish in completions:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if finish == "stop" and eos is not None:
            ids.append(eos)
        rows.append(ids)
    out: list[list[float]] = [[0.0] * len(r) for r in rows]
    run = [i for i, r in enumerate(rows) if r and (max_tokens is None or len(r) <= max_tokens)]
    for i, r in enumerate(rows):
        if max_tokens is not None and len(r) > max_tokens:
            out[i] = [0.0] * (max_tokens + 1)
    if not run:
        return out
    width = len(prompt_ids) + max(len(rows[i]) for i in run)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    input_ids = torch.full((len(run), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(run), width), dtype=torch.long, device=device)
    for b, i in enumerate(run):
        seq = prompt_ids + rows[i]
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[b, : len(seq)] = 1
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    targets = input_ids[:, 1:]
    token_lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    start = len(prompt_ids) - 1
    for b, i in enumerate(run):
        out[i] = token_lp[b, start : start + len(rows[i])].tolist()
    return out
