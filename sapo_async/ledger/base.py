"""The ledger port: what the recorder, the audit and the swarm need from a chain.

Owns the protocol only. Backends: :mod:`sapo_async.ledger.memory` (the contract's rules in
plain Python) and :mod:`sapo_async.ledger.evm` over web3, reached either
through the in-process EVM (:mod:`~sapo_async.ledger.embedded`, eth-tester + py-evm, the
embedded default) or a JSON-RPC URL (:mod:`~sapo_async.ledger.rpc`: anvil, testnets, L2s).

Every method can block on the chain, so every method is async. Errors: connection trouble
is :class:`~sapo_async.errors.LedgerUnavailable`; a revert is
:class:`~sapo_async.errors.CommitmentRejected` carrying the contract's custom error name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from eth_account.signers.local import LocalAccount

from sapo_async.errors import LedgerError
from sapo_async.ledger.types import (
    CommitmentPayload,
    OnChainCommitment,
    OnChainTotals,
    SubmitReceipt,
    UsageCredit,
)

__all__ = ["Ledger"]


@runtime_checkable
class Ledger(Protocol):
    """A deployed ``SapoLedger`` seen through one transaction sender."""

    @property
    def address(self) -> str:
        """Checksummed address of the ledger contract."""
        ...

    @property
    def chain_id(self) -> int:
        """Chain id the ledger lives on (part of every EIP-712 signature)."""
        ...

    async def register(self, node: LocalAccount, metadata: str = "") -> bool:
        """Register ``node`` (idempotent); True if this call registered it."""
        ...

    async def submit(self, node: LocalAccount, payload: CommitmentPayload) -> SubmitReceipt:
        """Send ``node``'s commitment (directly, or relayed with its EIP-712 signature)."""
        ...

    async def submit_batch(
        self, node: LocalAccount, payloads: Sequence[CommitmentPayload]
    ) -> list[SubmitReceipt]:
        """Send ``node``'s commitments (ascending rounds) as one transaction
        (``commitMany``): all land, in order, in one block, or none does. One receipt per
        commitment (the transaction's, with that round's claims). Relayed, the node signs
        each commitment (consecutive nonces) and the relayer sends ``commitManyBySig``."""
        ...

    async def submit_many(
        self, node: LocalAccount, payloads: Sequence[CommitmentPayload]
    ) -> list[SubmitReceipt | LedgerError]:
        """Send ``node``'s commitments (ascending rounds, at most ``MAX_BATCH`` used): the
        longest prefix the chain accepts as one :meth:`submit_batch`, then the error of the
        first refused (a later round landing would supersede it), so one bad round never holds
        back those before it. One outcome per commitment sent, relayed or not."""
        ...

    async def settle_credit(
        self, sender: LocalAccount, consumer: str, round_: int, producer: str, producer_round: int
    ) -> SubmitReceipt:
        """Credit ``consumer``'s claim (made in its ``round_``) on ``producer``'s round
        ``producer_round``, now on chain; anyone may send it."""
        ...

    async def settle_credits(
        self, sender: LocalAccount, claims: Sequence[tuple[str, int, str, int]]
    ) -> list[SubmitReceipt]:
        """:meth:`settle_credit` of each (consumer, round, producer, producer round) in one
        transaction (``settleCredits``, 1 to ``MAX_BATCH``), all or none."""
        ...

    async def claim_of(self, consumer: str, round_: int, producer: str, producer_round: int) -> int:
        """Unsettled rollouts of that claim (0: none, or already settled)."""
        ...

    async def commitment_of(self, node: str, round_: int) -> OnChainCommitment | None:
        """The stored commitment of ``node`` for ``round_``, or None."""
        ...

    async def node_stats(self, node: str) -> OnChainTotals:
        """Running totals of ``node``."""
        ...

    async def nodes(self) -> list[str]:
        """Every registered node, in registration order."""
        ...

    async def rounds_of(self, node: str) -> list[int]:
        """Rounds ``node`` committed, ascending."""
        ...

    async def is_rollout_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Whether the chain accepts ``proof`` of ``rollout_hash`` in ``node``'s round."""
        ...

    async def is_external_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Same for the external rollouts ``node`` trained on in ``round_``."""
        ...

    async def credited_by(self, consumer: str, producer: str, producer_round: int) -> int:
        """Rollouts of ``producer``'s round ``producer_round`` that ``consumer`` has credited
        (never above what the producer committed for that round)."""
        ...

    async def usage_credits(
        self, *, producer: str | None = None, consumer: str | None = None
    ) -> list[UsageCredit]:
        """``UsageCredited`` events, optionally filtered by producer and/or consumer."""
        ...

    async def commitments(self, node: str | None = None) -> list[OnChainCommitment]:
        """Every ``CommitmentRecorded`` event (optionally of one node), oldest first."""
        ...
