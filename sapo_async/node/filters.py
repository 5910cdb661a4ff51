"""Filters on external groups by their behaviour log-probs (``TrainingSpec.external_filter``).

Owns :class:`RatioFilter`: drop another node's group when the receiver's policy and the
producer's (behaviour) policy disagree too much about its completions, in the spirit of
F-TIS (arXiv 2605.22537: filter, rather than only truncate, importance weights of
off-policy samples). For each completion the filter takes the mean over its tokens of
``log pi_receiver(token) - log pi_behaviour(token)``, i.e. the log of the geometric-mean
per-token importance ratio; a group is dropped when any completion's ratio lies outside
``[1 / cap, cap]``. Every ratio seen is kept in :attr:`RatioFilter.log_ratios`, so an
experiment can report their spread.

Deliberately does not change the trainer: truncated importance weights
(``TrainerConfig.tis_cap``) are the trainer's; this only decides which groups reach it. A
group without behaviour log-probs, or from a tokenizer other than the receiver's, passes
unchanged (there is nothing to compare).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from sapo_async.errors import ConfigError
from sapo_async.policy.grpo.trainer import ScoredGroup

__all__ = ["RatioFilter", "completion_log_ratios"]


def completion_log_ratios(learner: Any, group: ScoredGroup) -> list[float]:
    """Mean per-token log importance ratio (receiver over behaviour) of each completion
    that carries token ids and behaviour log-probs under the receiver's tokenizer."""
    if group.tokenizer_id != learner.tokenizer_id:
        return []
    comps = [
        c
        for c in group.completions
        if c.token_ids and c.behaviour_logprobs and len(c.token_ids) == len(c.behaviour_logprobs)
    ]
    if not comps:
        return []
    tokenizer = learner.tokenizer
    prompt = list(
        tokenizer(group.prompt, add_special_tokens=not learner.settings.chat_template)["input_ids"]
    )
    rows = [prompt + list(c.token_ids or ()) for c in comps]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attn[i, : len(row)] = 1
    model = learner.model
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    out: list[float] = []
    for i, c in enumerate(comps):
        n = len(c.token_ids or ())
        start = len(prompt) - 1  # position predicting the first completion token
        mine = logp[i, start : start + n]
        theirs = torch.tensor(c.behaviour_logprobs or (), dtype=torch.float32)
        out.append(float((mine - theirs).mean()))
    return out


@dataclass
class RatioFilter:
    """Drop external groups whose importance ratio to the receiver is extreme.

    Attributes:
        cap: a completion's geometric-mean per-token ratio must lie in ``[1/cap, cap]``.
        log_ratios: every completion's log ratio seen so far (for reports).
        dropped: groups dropped so far.
    """

    cap: float = 2.0
    log_ratios: list[float] = field(default_factory=list)
    dropped: int = 0

    def __post_init__(self) -> None:
        if not self.cap > 1.0:
            raise ConfigError(f"ratio filter cap must be > 1, got {self.cap}", field="cap")

    def __call__(self, learner: Any, group: ScoredGroup) -> str | None:
        """``"ratio_extreme"`` when the group should be dropped, else None."""
        ratios = completion_log_ratios(learner, group)
        self.log_ratios.extend(ratios)
        bound = math.log(self.cap)
        if any(abs(r) > bound for r in ratios):
            self.dropped += 1
            return "ratio_extreme"
        return None
