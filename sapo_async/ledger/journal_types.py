"""The ledger journal's value types: where an entry and a credit claim stand.

Owns the records :class:`~sapo_async.ledger.journal.Journal` reads back (and re-exports):
a journaled commitment with its delivery state, a rollout's location, a landed commitment's
credit claim. Knows nothing of SQLite.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sapo_async.ledger.types import RoundCommitment

__all__ = ["ClaimState", "CreditClaim", "EntryState", "JournalEntry", "RolloutLocation"]


class EntryState(StrEnum):
    """Where a journaled commitment stands."""

    PENDING = "pending"
    LANDED = "landed"
    FAILED = "failed"


class ClaimState(StrEnum):
    """Where a landed commitment's usage entry stands on chain."""

    OPEN = "open"
    SETTLED = "settled"
    LAPSED = "lapsed"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class CreditClaim:
    """``node``'s round ``round`` trained on ``count`` rollouts of ``producer``'s round
    ``producer_round``: credited with the commitment when that round was already on chain,
    else a claim on chain until someone settles it (``SapoLedger.settleCredit``)."""

    node: str
    round: int
    producer: str
    producer_round: int
    count: int
    state: ClaimState
    created_at: float


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journaled commitment and its delivery state."""

    commitment: RoundCommitment
    state: EntryState
    attempts: int
    last_error: str | None
    tx_hash: str | None
    block_number: int | None
    created_at: float
    settled_at: float | None

    @property
    def node(self) -> str:
        """The committing node."""
        return self.commitment.node

    @property
    def round(self) -> int:
        """The node's round."""
        return self.commitment.round


@dataclass(frozen=True, slots=True)
class RolloutLocation:
    """Where a rollout hash was committed: by ``node`` in ``round``.

    ``kind`` is ``"own"`` (the node shared it; ``producer == node``) or ``"external"`` (the
    node trained on it; ``producer`` made it).
    """

    rollout_hash: bytes
    node: str
    round: int
    kind: str
    producer: str
