"""Per producer, what this node saw of each of its newest groups: the memory the tail and
stock-lead records (:mod:`.tails`, :mod:`.leads`) read their verdicts from."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["ProducerWindows"]

V = TypeVar("V")


class ProducerWindows(Generic[V]):
    """Per producer, one value for each of its newest ``window`` groups, each group once
    (by its hash: a group scored again in a later round changes nothing)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._groups: dict[str, OrderedDict[bytes, V]] = {}

    def copy(self) -> ProducerWindows[V]:
        """An independent copy (what the selection thread may change)."""
        out: ProducerWindows[V] = ProducerWindows(self.window)
        out._groups = {p: OrderedDict(g) for p, g in self._groups.items()}
        return out

    def add(self, producer: str, rollout_hash: bytes, value: V) -> None:
        """Record one group (again: no change; the newest ``window`` are kept)."""
        groups = self._groups.setdefault(producer, OrderedDict())
        if rollout_hash in groups:
            return
        groups[rollout_hash] = value
        while len(groups) > self.window:
            groups.popitem(last=False)

    def values(self, producer: str) -> list[V]:
        """What was recorded of ``producer``'s groups, oldest first (none: empty)."""
        return list(self._groups.get(producer, {}).values())
