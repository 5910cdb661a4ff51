"""Filters on external groups by their behaviour log-probs (``TrainingSpec.external_filter``).

Owns :class:`RatioFilter`: drop another node's group when the receiver's policy and the
producer's (behaviour) policy disagree too much about its completions, in the spirit of
F-TIS (arXiv 2605.22537: filter, rather than only truncate, importance weights of
off-policy samples). For each completion the filter takes the mean over its tokens of
``log pi_receiver(token) - log pi_behaviour(token)``, i.e. the log of the geometric-mean
per-token importance ratio; a group is dropped when any completion's ratio lies outside
``[1 / cap, cap]``. Every ratio seen is kept in :attr:`RatioFilter.log_ratios`, so an
experiment can report their spread.

The receiver's log-probs come from the round's one view of the candidate
(:class:`~sapo_async.node.view.CandidateView`: computed once, on the model's device, shared
with the other checks). A filter is ``filter(view) -> reason | None``.

Deliberately does not change the trainer: truncated importance weights
(``TrainerConfig.tis_cap``) are the trainer's; this only decides which groups reach it. A
completion is measured only where the trainer would keep the peer's behaviour log-probs:
the producer used the receiver's tokenizer and its ids are exactly the receiver's
tokenisation of the text (otherwise there is nothing to compare, and the group passes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from sapo_async.errors import ConfigError
from sapo_async.node.view import CandidateView
from sapo_async.wire.reasons import RejectReason

__all__ = ["RatioFilter", "completion_log_ratios"]


def completion_log_ratios(view: CandidateView) -> list[float]:
    """Mean per-token log importance ratio (receiver over behaviour) of each completion
    whose peer ids spell its text (the token check) and carry behaviour log-probs that the
    trainer keeps (a completion cut after its answer keeps none, so it is not measured)."""
    measured = [i for i in range(len(view.token_ids)) if view.behaviour_logprobs(i)]
    if not measured:
        return []
    out: list[float] = []
    for i, mine in zip(measured, view.logprobs(measured), strict=True):
        theirs = torch.tensor(view.behaviour_logprobs(i) or (), dtype=torch.float32)
        out.append(float((mine.float() - theirs.to(mine.device)).mean()))
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

    def __call__(self, view: CandidateView) -> RejectReason | None:
        """``ratio_extreme`` when the group should be dropped, else None."""
        ratios = completion_log_ratios(view)
        self.log_ratios.extend(ratios)
        bound = math.log(self.cap)
        if any(abs(r) > bound for r in ratios):
            self.dropped += 1
            return RejectReason.RATIO_EXTREME
        return None
