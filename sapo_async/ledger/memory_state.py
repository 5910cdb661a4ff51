"""The memory ledger's storage: ``SapoLedger``'s state variables as plain Python data.

Owns what the contract keeps (registrations, per-node totals and rounds, commitments,
per-producer credit and claims, EIP-712 nonces, the two event logs, the block counter), the
two writes that are bookkeeping rather than rules (mining a block, applying a checked credit)
and :meth:`Storage.copy`, which the memory ledger takes before a ``commitMany`` batch and puts back
when one of its rounds is refused, so a batch is atomic as a transaction is. It does not know
the contract's rules: :mod:`sapo_async.ledger.memory` reads and writes it.

Invariant of :meth:`Storage.copy`: the copy shares no mutable container with the original
(stored values are frozen dataclasses or ints, so copying the containers is enough).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sapo_async.ledger.types import OnChainCommitment, SubmitReceipt, UsageCredit
from sapo_async.wire.rollout import keccak256

__all__ = ["Storage", "Totals"]


@dataclass(frozen=True, slots=True)
class Totals:
    """``SapoLedger.NodeInfo``: kept for any address, registered or only credited."""

    registered_at: int = 0
    rounds_committed: int = 0
    last_round: int = 0
    rollouts_committed: int = 0
    external_used: int = 0
    credit_received: int = 0


@dataclass(slots=True)
class Storage:
    """The contract's state; keys are checksummed addresses."""

    block: int = 0
    nodes: list[str] = field(default_factory=list)
    totals: dict[str, Totals] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    stored: dict[tuple[str, int], OnChainCommitment] = field(default_factory=dict)
    rounds: dict[str, list[int]] = field(default_factory=dict)
    nonces: dict[str, int] = field(default_factory=dict)
    recorded: list[OnChainCommitment] = field(default_factory=list)
    credited: list[UsageCredit] = field(default_factory=list)
    credited_by: dict[tuple[str, str, int], int] = field(default_factory=dict)
    claims: dict[tuple[str, int, str, int], int] = field(default_factory=dict)

    def totals_of(self, address: str) -> Totals:
        """``NodeInfo`` of ``address`` (all zero when it was never seen)."""
        return self.totals.get(address, Totals())

    def mine(self, address: str, call: str) -> SubmitReceipt:
        """A new block holding ``call`` to the ledger at ``address``; its synthetic receipt."""
        self.block += 1
        tx = keccak256(f"{address}:{self.block}:{call}".encode())
        return SubmitReceipt(tx_hash="0x" + tx.hex(), block_number=self.block, gas_used=0)

    def credit(
        self,
        consumer: str,
        round_: int,
        producer: str,
        producer_round: int,
        *,
        count: int,
        block: int,
    ) -> None:
        """Credit ``producer``'s round with ``count`` rollouts ``consumer`` used in ``round_``
        (``SapoLedger._creditNow`` after its checks): the counter, the total, the event."""
        key = (consumer, producer, producer_round)
        self.credited_by[key] = self.credited_by.get(key, 0) + count
        totals = self.totals_of(producer)
        self.totals[producer] = replace(totals, credit_received=totals.credit_received + count)
        self.credited.append(
            UsageCredit(producer, consumer, round_, count, block, producer_round=producer_round)
        )

    def copy(self) -> Storage:
        """A copy sharing no mutable container with this storage (O(state); a batch of a
        memory ledger pays it once)."""
        return Storage(
            block=self.block,
            nodes=list(self.nodes),
            totals=dict(self.totals),
            metadata=dict(self.metadata),
            stored=dict(self.stored),
            rounds={node: list(rounds) for node, rounds in self.rounds.items()},
            nonces=dict(self.nonces),
            recorded=list(self.recorded),
            credited=list(self.credited),
            credited_by=dict(self.credited_by),
            claims=dict(self.claims),
        )
