"""How much a node knows of each producer, and refusing one whose groups it mostly dropped.

One rule, two uses. A producer's *verdicts* are the round's judgements of its verified,
buffered groups (dropped or passed, one per group; admission refusals are unverified
claims and do not count). Once it has at least ``min_events`` of them and ``rate`` of its
last ones were drops, it is quarantined: refused at admission for ``duration_s``, before
its signature is checked (:class:`~sapo_async.node.admission.QuarantineCheck`), and its
buffered groups are no longer candidates.

*Evidence before influence*: the same rule decides when a producer's groups may be
trained at all. Until the quarantine's first decision on a producer is made in its favour
(:meth:`Evidence.cleared`: it would not refuse the producer at its ``min_events``-th
verdict even if every verdict still missing were a drop), the round judges the producer's
buffered groups in full (every stage, the draw's own) only to count them, and trains none
of them: only a producer the quarantine has judged can move the node's model
(:class:`Evidence`, used by :func:`~sapo_async.node.selection.select_groups`). An attacker
most of whose groups a check refuses is then quarantined on its first groups, before any
of the ones that slipped through is trained, and a key that sends too few groups to be
judged never trains anything. No producer the rule would refuse at its first decision is
drawn before it: clearing early only skips verdicts that could not change that decision.
What it costs an honest peer: its first groups are judged before any is trained, five
with no drop at ``min_events`` 8 and ``rate`` 0.5 (a few rounds of a peer that shares two
groups a round, part of one that shares eight; the judging is the draw's own work, done
once per group).
Before this (issue 57), the delay came from holds meant for other things (calibration and
the stock-lead record's probation): when they stopped holding a same-model peer, a trigger
attacker's groups that fit the token cap were trained in the first rounds, before its
refusals had quarantined it (docs/results/attack-real-token-test).

*Cannot* stop: a producer that sends honest groups until it has its verdicts and its
payload after (then only the drop rate over its window ends it, and only if a check sees
the payload); an attacker whose groups no check refuses.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cachetools import LRUCache, TTLCache

from sapo_async.limits import PRODUCERS_REMEMBERED, QUARANTINED_MAX

__all__ = ["QUARANTINE_WINDOW", "Evidence", "Quarantine"]

QUARANTINE_WINDOW = 64
"""Verdicts remembered per producer: eight rounds of an honest peer's B = 8 groups."""


def _refused(window: Sequence[bool], rate: float, min_events: int) -> bool:
    """The quarantine's rule on a producer's last verdicts (True: dropped)."""
    return len(window) >= min_events and sum(window) / len(window) >= rate


@dataclass(frozen=True, slots=True)
class Evidence:
    """The quarantine's verdicts on the pool's producers, frozen for the round's thread.

    Attributes:
        verdicts: per producer, its remembered verdicts as ``(rollout_hash, dropped)``,
            oldest first (a producer not listed has none).
        rate / min_events: the quarantine's rule.
    """

    verdicts: Mapping[str, tuple[tuple[bytes | None, bool], ...]]
    rate: float
    min_events: int

    def cleared(self, producer: str, new: Sequence[bool] = ()) -> bool:
        """Whether ``producer``'s groups may be trained once ``new`` verdicts are added:
        the quarantine will not refuse it at its ``min_events``-th verdict even if every
        verdict it still lacks were a drop (so the rule's first decision is already made,
        in its favour), or, with that many, does not refuse it now."""
        old = [dropped for _, dropped in self.verdicts.get(producer, ())]
        window = [*old, *new]
        window += [True] * max(0, self.min_events - len(window))
        return not _refused(window[-QUARANTINE_WINDOW:], self.rate, self.min_events)

    def short(self, producer: str) -> int:
        """How many more verdicts ``producer`` needs to reach the quarantine's minimum."""
        return max(0, self.min_events - len(self.verdicts.get(producer, ())))

    def judged(self, producer: str) -> frozenset[bytes | None]:
        """The hashes of ``producer``'s groups that already have a verdict."""
        return frozenset(h for h, _ in self.verdicts.get(producer, ()))

    def refuses(self, producer: str, new: Sequence[bool]) -> bool:
        """Whether the quarantine will refuse ``producer`` once ``new`` verdicts are added
        (the same rule :meth:`Quarantine.record` applies)."""
        old = [dropped for _, dropped in self.verdicts.get(producer, ())]
        return _refused([*old, *new][-QUARANTINE_WINDOW:], self.rate, self.min_events)


class Quarantine:
    """Refuses a producer for ``duration_s`` once ``rate`` of its last verdicts (at least
    ``min_events`` of them) were drops; one verdict per group (a group judged again, for
    example one left in the buffer as uninformative, is not counted again).

    Bounded in producers, not only per producer (keys are free: a stranger signing each
    group with a new key must not grow it for ever), by two ``cachetools`` maps kept apart so
    that churn in one cannot free anyone from the other:

    * the verdicts (a window of :data:`QUARANTINE_WINDOW` per producer) of at most
      :data:`~sapo_async.limits.PRODUCERS_REMEMBERED` producers, the least recently judged
      forgotten first (an LRU cache). A peer that keeps sending is judged every round it
      has groups, and a round judges at most a buffer's worth of producers, so a peer
      judged at least every other round keeps its verdicts whatever the flood; a producer
      forgotten had none of its groups judged while that many others had, and starts again
      as a new key would (which any stranger can have at will), its drops so far forgiven
      and its evidence to be earned again;
    * the quarantined producers, at most :data:`~sapo_async.limits.QUARANTINED_MAX`, each
      until its quarantine ends (a TTL cache on ``clock``). A flood of fresh keys never
      enters it (a key gets in only by ``min_events`` judged verdicts, mostly drops), so it
      cannot free a quarantined producer; only more quarantines than the bound within one
      ``duration_s`` can, and then the one whose quarantine ends soonest goes first (a look
      at a producer does not count as use: the map forgets in order of entry).

    Args:
        rate / min_events / duration_s: see :class:`~sapo_async.node.spec.DefenceSpec`.
        clock: unix seconds (injectable for tests).
    """

    def __init__(
        self,
        rate: float,
        min_events: int,
        duration_s: float,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._rate, self._min, self._duration = rate, min_events, duration_s
        self._clock = clock or time.time  # looked up now, not at import
        self._verdicts: LRUCache[str, deque[tuple[bytes | None, bool]]] = LRUCache(
            PRODUCERS_REMEMBERED
        )
        self._until: TTLCache[str, float] = TTLCache(QUARANTINED_MAX, duration_s, self._clock)
        self.entered = 0

    def record(self, producer: str, dropped: bool, rollout_hash: bytes | None = None) -> bool:
        """Count one verdict on a producer's group (identified by ``rollout_hash``; a group
        already in the window is not counted twice); True when it enters quarantine now."""
        window = self._verdicts.get(producer)
        if window is None:
            window = self._verdicts[producer] = deque(maxlen=QUARANTINE_WINDOW)
        if rollout_hash is not None and any(h == rollout_hash for h, _ in window):
            return False
        window.append((rollout_hash, dropped))
        if self.blocked(producer) or not _refused([d for _, d in window], self._rate, self._min):
            return False
        self._until[producer] = self._clock() + self._duration
        window.clear()
        self.entered += 1
        return True

    def record_all(self, verdicts: Iterable[tuple[str, bool, bytes]]) -> list[str]:
        """:meth:`record` each ``(producer, dropped, rollout_hash)`` (a round's verdicts:
        the round's judgement of verified, buffered groups; admission refusals are
        unverified claims and never count); the producers that entered quarantine."""
        return [p for p, dropped, h in verdicts if self.record(p, dropped, h)]

    def evidence(self, producers: Iterable[str]) -> Evidence:
        """The verdicts on ``producers`` (the round's pool), frozen for its thread."""
        verdicts = {}
        for p in set(producers):
            window = self._verdicts.get(p)
            if window:
                verdicts[p] = tuple(window)
        return Evidence(verdicts, self._rate, self._min)

    def blocked(self, producer: str) -> bool:
        """True while ``producer`` is quarantined."""
        return producer in self._until  # a look, not a use: no reordering, expiry checked

    def active(self) -> list[str]:
        """The producers quarantined now, sorted."""
        return sorted(self._until)  # the cache lists only those not expired
