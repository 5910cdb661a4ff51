"""What a collector holds and reports: buffered groups and its statistics.

Owns the plain data the collector (:mod:`.collector`) keeps and hands out; no logic.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sapo_async.actors import ActorStatistics
from sapo_async.wire.rollout import RolloutGroup

__all__ = ["BufferedGroup", "CollectorStatistics", "Counters"]


@dataclass(frozen=True, slots=True)
class BufferedGroup:
    """A verified external group in the buffer.

    Attributes:
        group: the decoded group.
        rollout_hash: its keccak-256 (32 bytes), the key everything else uses.
        received_at: unix seconds when the collector admitted it.
    """

    group: RolloutGroup
    rollout_hash: bytes
    received_at: float

    @property
    def producer(self) -> str:
        """The verified producer address."""
        return self.group.producer


@dataclass(frozen=True, slots=True)
class CollectorStatistics:
    """A snapshot of a collector.

    Attributes:
        actor: the actor runtime's statistics.
        received: messages seen.
        accepted: groups admitted to the buffer.
        skipped_own: this node's own groups, skipped.
        rejected: rejections by reason.
        buffered: groups in the buffer now.
        evicted: groups evicted from the buffer, by cause (``age``, ``count``, ``round``,
            ``taken``).
        producers: distinct producers in the buffer now.
        dropped: buffered groups the receiver dropped after admission, by reason.
    """

    actor: ActorStatistics
    received: int
    accepted: int
    skipped_own: int
    rejected: dict[str, int]
    buffered: int
    evicted: dict[str, int]
    producers: int
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def rejected_total(self) -> int:
        """All rejections together."""
        return sum(self.rejected.values())


@dataclass(slots=True)
class Counters:
    """A collector's running counts (see :class:`CollectorStatistics`)."""

    received: int = 0
    accepted: int = 0
    skipped_own: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    evicted: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
