"""Which producers this node trained recently: the balanced draw's record.

SAPO's sampler (``paper``) draws J external groups uniformly from the informative ones, so
its draw is over *groups*: a producer whose every group is informative by construction
(the inject and tokens attacks leave, once the answer cut has removed their payload, a bare
right answer beside a bare wrong one) wins nearly every slot against an honest peer whose
groups, at a reward near 0.1, are informative about a third of the time (160 of 170 slots
in the recorded SmolLM2 matrix, docs/security.md). With ``[defence] balanced_draw`` the
sampler walks the least served producers first (:func:`~sapo_async.node.sampler.select_external`'s
``served``), where served is read from this record: how many of this node's last
:data:`WINDOW` trained external groups each producer supplied.

*Cannot* stop: an attacker with many keys (each new key starts least served; the draw
bounds a producer, not a person), nor the share an attacker wins when the honest peers have
no informative group to offer. No producer is refused or quarantined for it.

Threads: the record lives on the event loop; the selection thread gets :meth:`counts`
(a plain dict) and the loop records what was chosen (:meth:`record`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

__all__ = ["WINDOW", "ServedRecord"]

WINDOW = 32
"""Trained external groups the counts are read over (the newest ones)."""


class ServedRecord:
    """The producers of this node's last ``window`` trained external groups."""

    def __init__(self, window: int = WINDOW):
        if window < 1:
            raise ValueError(f"window {window!r} is not allowed: at least 1")
        self._last: deque[str] = deque(maxlen=window)

    def record(self, producers: Iterable[str]) -> None:
        """Add a round's trained external groups' producers (oldest fall out)."""
        self._last.extend(producers)

    def counts(self) -> dict[str, int]:
        """Groups served per producer over the window (a copy: safe to hand a thread)."""
        return dict(Counter(self._last))
