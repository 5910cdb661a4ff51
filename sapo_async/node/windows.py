"""Per producer, what this node saw of each of its newest groups: the memory the stock-lead
record (:mod:`.leads`) reads its verdicts from.

Bounded twice: per producer by ``window`` groups, and in producers by
:data:`~sapo_async.limits.PRODUCERS_REMEMBERED`, the least recently seen forgotten first
(a ``cachetools`` LRU cache). Keys are free, so a stranger who signs each group with a new
key would otherwise grow it by one producer a group, for ever.

Why forgetting the least recently seen is safe:

* a producer is *seen* when a group of it is added or its window is read, and the record
  reads it for every group of it the node scores (rewarded or not), so a peer whose groups
  keep arriving is among the most recently seen;
* new producers enter only from groups the node scored, at most a buffer's worth
  (:data:`~sapo_async.limits.BUFFER_MAX_GROUPS`) a round, so a peer scored within the last
  two buffers' worth of other producers is never forgotten, whatever the flood;
* a producer that is forgotten starts again as a new key: judged from nothing (on
  probation, its groups wait again until judged). That is what any stranger can have at
  will by signing with a fresh key, so forgetting gives an attacker nothing it lacked.

Invariant: at most ``producers`` producers, each with at most ``window`` groups.
"""

from __future__ import annotations

import copy
from typing import Generic, TypeVar

from cachetools import LRUCache

from sapo_async.limits import PRODUCERS_REMEMBERED

__all__ = ["ProducerWindows"]

V = TypeVar("V")


class ProducerWindows(Generic[V]):
    """Per producer, one value for each of its newest ``window`` groups, each group once
    (by its hash: a group scored again in a later round changes nothing), for at most
    ``producers`` producers, the least recently seen (added or read) forgotten first.

    Args:
        window: groups kept per producer.
        producers: producers kept.
    """

    def __init__(self, window: int, producers: int = PRODUCERS_REMEMBERED) -> None:
        self.window = window
        self.producers = producers
        # A window is a tuple, replaced on add, never changed in place: a copy can share it.
        self._groups: LRUCache[str, tuple[tuple[bytes, V], ...]] = LRUCache(producers)

    def __len__(self) -> int:
        """Producers remembered now (at most ``producers``)."""
        return len(self._groups)

    def copy(self) -> ProducerWindows[V]:
        """An independent copy (what the selection thread may change), which forgets in the
        same order as the original (cachetools >= 8 copies a cache with its order)."""
        out: ProducerWindows[V] = ProducerWindows(self.window, self.producers)
        out._groups = copy.copy(self._groups)
        return out

    def add(self, producer: str, rollout_hash: bytes, value: V) -> None:
        """Record one group (again: no change but that ``producer`` was seen; the newest
        ``window`` are kept)."""
        groups = self._groups.get(producer, ())
        if any(seen == rollout_hash for seen, _ in groups):
            return
        kept = (*groups, (rollout_hash, value))
        self._groups[producer] = kept[max(0, len(kept) - self.window) :]

    def values(self, producer: str) -> list[V]:
        """What was recorded of ``producer``'s groups, oldest first (none: empty); reading
        counts as seeing it."""
        return [value for _, value in self._groups.get(producer, ())]
