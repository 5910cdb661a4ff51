"""In-memory backend of the ledger port: ``SapoLedger``'s rules in plain Python, no EVM.

Owns a process-local copy of the contract's state (:class:`~sapo_async.ledger.memory_state.Storage`:
registrations, per-node rounds and totals, commitments, per-producer credit, EIP-712 nonces,
the two event logs) and enforces
the same rules in the same order, refusing with the same
:class:`~sapo_async.errors.CommitmentRejected` ``reason`` the EVM backend decodes from a
revert (``SapoLedgerRoundNotIncreasing``, ``InvalidAccountNonce``, ...). It is for unit
tests, examples and single-process swarms that want the ledger's behaviour without
eth-tester's start-up and per-call cost. It does not know about journals or retries.

One conformance suite (``tests/integration/test_ledger_conformance.py``) runs here and on EVMs.

Invariants (those of the contract):
- a node commits only once registered; its rounds strictly increase (no overwrite, no
  back-fill) and jump at most ``MAX_ROUND_STEP`` (no lock-out at 2**64-1); a root is zero
  exactly when its count is; counts are at most ``MAX_ROLLOUTS_PER_ROUND``;
- usage lists are at most ``MAX_PRODUCERS`` entries, ascending by (producer, producer
  round), without the node itself or zero counts, and add up to the external count;
- credit rules: each entry credits a producer round that was committed with rollouts, and a
  consumer's credit to one producer round, over all its commitments, never exceeds the
  rollout count committed for it; an entry whose producer round is not stored yet is kept
  as a claim of the consumer's round, credited by :meth:`MemoryLedger.settle_credit` under
  the same rules once that round is stored;
- a relayed registration or commitment carries the node's EIP-712 signature over this
  ledger's domain (chain id, address) and consumes the node's nonce, so it cannot be replayed.

What it cannot mirror (the conformance suite says so where it matters):
- gas and balances: nobody pays; ``SubmitReceipt.gas_used`` is 0;
- transactions: ``tx_hash`` is synthetic (keccak-256 of the block number and the call),
  unique per ledger but not a hash any chain would produce;
- blocks: each accepted call "mines" one block (a batch one in all); refused calls mine none
  (a refused batch puts the storage back as it was); timestamps are the wall clock;
- arithmetic-overflow panics of the 64-bit totals (they need 2**64 rollouts);
- ``ECDSAInvalidSignatureS``: a malleable high-s signature is refused as
  ``ECDSAInvalidSignature`` when eth_keys cannot recover it, instead of by its own name;
- state lives and dies with the object, and is not shared between processes.

Concurrency: every method finishes its state change without awaiting anything after an
initial checkpoint, so calls from tasks of one event loop are atomic. Not thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import anyio
from eth_account.signers.local import LocalAccount

from sapo_async.errors import LedgerError
from sapo_async.ledger.chain import reverted
from sapo_async.ledger.memory_checks import check_abi_widths, check_signer, check_usage
from sapo_async.ledger.memory_state import Storage
from sapo_async.ledger.merkle import verify_proof
from sapo_async.ledger.signing import (
    commitment_typed_data,
    registration_typed_data,
    sign_commitment,
    sign_registration,
    typed_digest,
)
from sapo_async.ledger.types import (
    MAX_BATCH,
    MAX_ROLLOUTS_PER_ROUND,
    MAX_ROUND_STEP,
    CommitmentPayload,
    OnChainCommitment,
    OnChainTotals,
    SubmitReceipt,
    UsageCredit,
    checksum,
)
from sapo_async.logs import get_logger
from sapo_async.wire.rollout import keccak256

__all__ = ["MEMORY_CHAIN_ID", "MemoryLedger"]

MEMORY_CHAIN_ID = 1337
"""Chain id of a memory ledger unless given: a dev-chain id (no public chain uses it), so a
signature made for a memory ledger is worthless on any real network."""

_ZERO_ROOT = bytes(32)
_CLAIM_FIELDS = ("consumer", "round", "producer", "producerRound")

_log = get_logger("ledger")


class MemoryLedger:
    """``SapoLedger`` for one swarm, held in this process; implements :class:`Ledger`.

    Args:
        swarm: the swarm's name; with ``chain_id`` it fixes the default ``address``.
        relayer: account that "sends" for nodes with their EIP-712 signatures (as in
            :class:`~sapo_async.ledger.evm.EvmLedger`); None: each node sends its own.
        chain_id: the chain id bound into every signature.
        address: the ledger's address (the EIP-712 verifying contract); default derived
            from ``swarm`` and ``chain_id``.
    """

    def __init__(
        self,
        swarm: str = "local",
        *,
        relayer: LocalAccount | None = None,
        chain_id: int = MEMORY_CHAIN_ID,
        address: str | None = None,
    ) -> None:
        default = "0x" + keccak256(f"memory-ledger:{chain_id}:{swarm}".encode())[-20:].hex()
        self._address = checksum(address or default)
        self._chain_id = chain_id
        self.relayer = relayer
        self._s = Storage()

    @property
    def address(self) -> str:
        """Checksummed address of this ledger (its EIP-712 verifying contract)."""
        return self._address

    @property
    def chain_id(self) -> int:
        """Chain id bound into every signature."""
        return self._chain_id

    # ------------------------------------------------------------------ writes

    async def register(self, node: LocalAccount, metadata: str = "") -> bool:
        """Register ``node`` unless it already is (relayed with its signature if this
        ledger has a relayer other than the node).

        Returns:
            True if this call registered the node, False if it already was.
        """
        await anyio.lowlevel.checkpoint()
        address = checksum(node.address)
        if self._s.totals_of(address).registered_at:
            return False
        if self._direct(address):
            self._register(address, metadata)
        else:
            nonce = self._s.nonces.get(address, 0)
            signature = sign_registration(node, self._chain_id, self._address, metadata, nonce)
            data = registration_typed_data(self._chain_id, self._address, address, metadata, nonce)
            check_signer(address, data, signature)
            self._use_nonce(address, nonce)
            self._register(address, metadata)
        _log.info("node_registered", node=address, ledger=self._address)
        return True

    async def submit(self, node: LocalAccount, payload: CommitmentPayload) -> SubmitReceipt:
        """Record ``node``'s commitment: directly, or relayed with its EIP-712 signature.

        Raises:
            CommitmentRejected: a rule of the contract refused it (``reason`` names the
                contract's custom error, e.g. ``SapoLedgerRoundNotIncreasing``).
            LedgerError: a value does not fit the contract's integer widths (web3 would
                refuse to encode it).
        """
        await anyio.lowlevel.checkpoint()
        check_abi_widths(payload)
        return self._send(node, payload)

    async def submit_batch(
        self, node: LocalAccount, payloads: Sequence[CommitmentPayload]
    ) -> list[SubmitReceipt]:
        """``SapoLedger.commitMany`` (relayed, ``commitManyBySig``): ``node``'s commitments
        in one "block", all or none.

        Raises:
            CommitmentRejected: a rule refused one of them (nothing landed), or the batch
                holds no commitment or more than ``MAX_BATCH`` (``SapoLedgerBatchLength``).
            LedgerError: a value does not fit the contract's integer widths.
        """
        await anyio.lowlevel.checkpoint()
        address = checksum(node.address)
        if len(payloads) == 1:
            return [await self.submit(node, payloads[0])]
        if not 1 <= len(payloads) <= MAX_BATCH:
            raise reverted("SapoLedgerBatchLength", length=len(payloads), max=MAX_BATCH)
        for payload in payloads:
            check_abi_widths(payload)
        saved = self._s.copy()
        try:
            mined = self._s.mine(self._address, f"commitMany:{address}:{payloads[0].round}")
            return [self._send(node, p, mined) for p in payloads]
        except LedgerError:
            self._s = saved  # the transaction reverted: none of it happened
            raise

    async def submit_many(
        self, node: LocalAccount, payloads: Sequence[CommitmentPayload]
    ) -> list[SubmitReceipt | LedgerError]:
        """The longest prefix of ``payloads`` that the rules accept, as one batch
        (:meth:`submit_batch`), then the error of the first refused."""
        address = checksum(node.address)
        payloads = payloads[:MAX_BATCH]
        saved, good, refused = self._s.copy(), 0, None
        try:  # a dry run finds the first refused and its error (EvmLedger simulates prefixes)
            for payload in payloads:
                check_abi_widths(payload)
                self._commit(address, payload, sender=address)
                good += 1
        except LedgerError as exc:
            refused = exc
        self._s = saved
        try:
            landed: list[SubmitReceipt | LedgerError] = []
            landed += await self.submit_batch(node, payloads[:good]) if good else []
        except LedgerError as exc:  # refused as a whole (relayed: a nonce or signature rule)
            return [exc]
        return landed if refused is None else [*landed, refused]

    async def submit_signed(
        self, node: str, payload: CommitmentPayload, nonce: int, signature: bytes
    ) -> SubmitReceipt:
        """Relay a commitment ``node`` signed elsewhere (the contract's ``commitBySig``).

        Raises:
            LedgerError: this ledger has no relayer.
            CommitmentRejected: ``SapoLedgerInvalidSigner`` (another key signed),
                ``InvalidAccountNonce`` (not the node's next nonce), an ``ECDSA...`` error
                (malformed signature) or any commitment rule.
        """
        await anyio.lowlevel.checkpoint()
        check_abi_widths(payload)
        return self._relay(checksum(node), payload, nonce, signature)

    # ------------------------------------------------------------------ reads

    async def commitment_of(self, node: str, round_: int) -> OnChainCommitment | None:
        """The stored commitment of ``node`` for ``round_``, or None if there is none."""
        await anyio.lowlevel.checkpoint()
        return self._s.stored.get((checksum(node), round_))

    async def node_stats(self, node: str) -> OnChainTotals:
        """Running totals of ``node`` (zeros for an unknown address)."""
        await anyio.lowlevel.checkpoint()
        address = checksum(node)
        t = self._s.totals_of(address)
        return OnChainTotals(
            node=address,
            registered=t.registered_at != 0,
            metadata=self._s.metadata.get(address, ""),
            rounds_committed=t.rounds_committed,
            last_round=t.last_round if t.rounds_committed else None,
            rollouts_committed=t.rollouts_committed,
            external_used=t.external_used,
            credit_received=t.credit_received,
        )

    async def nodes(self) -> list[str]:
        """Every registered node, in registration order."""
        await anyio.lowlevel.checkpoint()
        return list(self._s.nodes)

    async def rounds_of(self, node: str) -> list[int]:
        """Rounds ``node`` committed, ascending."""
        await anyio.lowlevel.checkpoint()
        return list(self._s.rounds.get(checksum(node), ()))

    async def is_rollout_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Whether ``proof`` shows ``rollout_hash`` in ``node``'s round (own rollouts)."""
        await anyio.lowlevel.checkpoint()
        return self._included(node, round_, rollout_hash, proof, external=False)

    async def is_external_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Same for the external rollouts ``node`` trained on in ``round_``."""
        await anyio.lowlevel.checkpoint()
        return self._included(node, round_, rollout_hash, proof, external=True)

    async def credit_received(self, producer: str) -> int:
        """Rollouts of ``producer`` that other nodes reported training on."""
        await anyio.lowlevel.checkpoint()
        return self._s.totals_of(checksum(producer)).credit_received

    async def nonce(self, node: str) -> int:
        """Next EIP-712 nonce of ``node``."""
        await anyio.lowlevel.checkpoint()
        return self._s.nonces.get(checksum(node), 0)

    async def commitment_digest(self, node: str, payload: CommitmentPayload, nonce: int) -> bytes:
        """The EIP-712 digest ``node`` signs to have ``payload`` relayed with ``nonce``."""
        await anyio.lowlevel.checkpoint()
        return typed_digest(
            commitment_typed_data(self._chain_id, self._address, checksum(node), payload, nonce)
        )

    async def usage_credits(
        self, *, producer: str | None = None, consumer: str | None = None
    ) -> list[UsageCredit]:
        """``UsageCredited`` events, optionally filtered, oldest first."""
        await anyio.lowlevel.checkpoint()
        p = checksum(producer) if producer is not None else None
        c = checksum(consumer) if consumer is not None else None
        return [
            u
            for u in self._s.credited
            if (p is None or u.producer == p) and (c is None or u.consumer == c)
        ]

    async def commitments(self, node: str | None = None) -> list[OnChainCommitment]:
        """Every ``CommitmentRecorded`` event (optionally of one node), oldest first."""
        await anyio.lowlevel.checkpoint()
        address = checksum(node) if node is not None else None
        return [e for e in self._s.recorded if address is None or e.node == address]

    # ------------------------------------------------------------------ the contract

    def _included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes], *, external: bool
    ) -> bool:
        c = self._s.stored.get((checksum(node), round_))
        if c is None:
            return False
        root, count = (
            (c.external_root, c.external_count) if external else (c.rollout_root, c.rollout_count)
        )
        return count != 0 and verify_proof(root, rollout_hash, proof)

    def _direct(self, node: str) -> bool:
        return self.relayer is None or checksum(self.relayer.address) == node

    def _use_nonce(self, node: str, nonce: int) -> None:
        current = self._s.nonces.get(node, 0)
        if nonce != current:
            raise reverted("InvalidAccountNonce", account=node, currentNonce=current)
        self._s.nonces[node] = current + 1

    def _register(self, node: str, metadata: str) -> SubmitReceipt:
        if self._s.totals_of(node).registered_at:
            raise reverted("SapoLedgerAlreadyRegistered", node=node)
        receipt = self._s.mine(self._address, f"register:{node}")
        self._s.totals[node] = replace(self._s.totals_of(node), registered_at=receipt.block_number)
        self._s.metadata[node] = metadata
        self._s.nodes.append(node)
        return receipt

    def _send(
        self, node: LocalAccount, payload: CommitmentPayload, mined: SubmitReceipt | None = None
    ) -> SubmitReceipt:
        """``node``'s commitment, sent by the node or relayed with its signature (next nonce)."""
        address = checksum(node.address)
        if self._direct(address):
            return self._commit(address, payload, sender=address, mined=mined)
        nonce = self._s.nonces.get(address, 0)
        signature = sign_commitment(node, self._chain_id, self._address, payload, nonce)
        return self._relay(address, payload, nonce, signature, mined)

    def _relay(
        self,
        node: str,
        payload: CommitmentPayload,
        nonce: int,
        signature: bytes,
        mined: SubmitReceipt | None = None,
    ) -> SubmitReceipt:
        if self.relayer is None:
            raise LedgerError("relaying a signed commitment needs a client with a relayer")
        data = commitment_typed_data(self._chain_id, self._address, node, payload, nonce)
        check_signer(node, data, signature)
        self._use_nonce(node, nonce)
        return self._commit(node, payload, sender=checksum(self.relayer.address), mined=mined)

    def _commit(
        self, node: str, c: CommitmentPayload, *, sender: str, mined: SubmitReceipt | None = None
    ) -> SubmitReceipt:
        t = self._s.totals_of(node)
        if not t.registered_at:
            raise reverted("SapoLedgerNotRegistered", node=node)
        if t.rounds_committed and c.round <= t.last_round:
            raise reverted(
                "SapoLedgerRoundNotIncreasing", node=node, round=c.round, lastRound=t.last_round
            )
        max_round = t.last_round + MAX_ROUND_STEP if t.rounds_committed else MAX_ROUND_STEP
        if c.round > max_round:
            raise reverted("SapoLedgerRoundTooFar", node=node, round=c.round, maxRound=max_round)
        for count in (c.rollout_count, c.external_count):
            if count > MAX_ROLLOUTS_PER_ROUND:
                raise reverted("SapoLedgerCountTooLarge", count=count, max=MAX_ROLLOUTS_PER_ROUND)
        for root, count in ((c.rollout_root, c.rollout_count), (c.external_root, c.external_count)):
            if (root == _ZERO_ROOT) != (count == 0):
                raise reverted("SapoLedgerRootCountMismatch", root=root, count=count)
        producers = check_usage(node, c)
        # The contract checks each entry's credit rules while crediting and reverts the
        # whole call on the first failure; checking all of them first is the same outcome.
        # An entry whose producer round is not stored becomes a claim (`SapoLedger._credit`).
        entries = list(zip(producers, c.producer_rounds, c.counts, strict=True))
        claims = [e for e in entries if (e[0], e[1]) not in self._s.stored]
        entries = [e for e in entries if (e[0], e[1]) in self._s.stored]
        for producer, producer_round, count in entries:
            self._check_credit(node, producer, producer_round, count)
        receipt = replace(
            mined or self._s.mine(self._address, f"commit:{node}:{c.round}:{sender}"),
            claimed=tuple((producer, producer_round) for producer, producer_round, _ in claims),
        )
        stored = OnChainCommitment(
            node=node,
            round=c.round,
            policy_version=c.policy_version,
            rollout_root=bytes(c.rollout_root),
            rollout_count=c.rollout_count,
            external_root=bytes(c.external_root),
            external_count=c.external_count,
            block_number=receipt.block_number,
            timestamp=int(time.time()),
        )
        # `last_round` only grows, so (node, round) is empty here: never overwritten.
        self._s.stored[(node, c.round)] = stored
        self._s.rounds.setdefault(node, []).append(c.round)
        self._s.totals[node] = replace(
            t,
            last_round=c.round,
            rounds_committed=t.rounds_committed + 1,
            rollouts_committed=t.rollouts_committed + c.rollout_count,
            external_used=t.external_used + c.external_count,
        )
        self._s.recorded.append(stored)
        for producer, producer_round, count in claims:
            self._s.claims[(node, c.round, producer, producer_round)] = count
        for producer, producer_round, count in entries:
            self._s.credit(
                node, c.round, producer, producer_round, count=count, block=receipt.block_number
            )
        return receipt

    async def settle_credit(
        self, sender: LocalAccount, consumer: str, round_: int, producer: str, producer_round: int
    ) -> SubmitReceipt:
        """``SapoLedger.settleCredit``: credit a claim now that its producer round is stored.

        Raises:
            CommitmentRejected: ``SapoLedgerNothingToSettle`` (none, or settled already),
                ``SapoLedgerProducerRoundNotCommitted``, ``SapoLedgerCreditExceedsShared``.
        """
        (receipt,) = await self.settle_credits(
            sender, [(consumer, round_, producer, producer_round)]
        )
        return receipt

    async def settle_credits(
        self, sender: LocalAccount, claims: Sequence[tuple[str, int, str, int]]
    ) -> list[SubmitReceipt]:
        """``SapoLedger.settleCredits``: :meth:`settle_credit` of each claim (consumer, round,
        producer, producer round) in one "block", all or none (``SapoLedgerBatchLength``
        for none or above ``MAX_BATCH``)."""
        await anyio.lowlevel.checkpoint()
        if not 1 <= len(claims) <= MAX_BATCH:
            raise reverted("SapoLedgerBatchLength", length=len(claims), max=MAX_BATCH)
        saved = self._s.copy()
        block = self._s.mine(self._address, f"settle:{claims}:{sender.address}")
        try:
            for key in [(checksum(c), r, checksum(p), pr) for c, r, p, pr in claims]:
                count = self._s.claims.pop(key, 0)
                if count == 0:
                    fields = dict(zip(_CLAIM_FIELDS, key, strict=True))
                    raise reverted("SapoLedgerNothingToSettle", **fields)
                self._check_credit(key[0], key[2], key[3], count)
                self._s.credit(*key, count=count, block=block.block_number)
        except LedgerError:
            self._s = saved  # the transaction reverted: none of it happened
            raise
        return [block] * len(claims)

    async def claim_of(self, consumer: str, round_: int, producer: str, producer_round: int) -> int:
        """``SapoLedger.claimOf``: unsettled rollouts of a claim (0: none, or settled)."""
        await anyio.lowlevel.checkpoint()
        key = (checksum(consumer), round_, checksum(producer), producer_round)
        return self._s.claims.get(key, 0)

    def _check_credit(self, consumer: str, producer: str, producer_round: int, count: int) -> None:
        """``SapoLedger._credit``'s checks of one usage entry."""
        shared = self._s.stored.get((producer, producer_round))
        if shared is None or shared.rollout_count == 0:
            raise reverted(
                "SapoLedgerProducerRoundNotCommitted",
                producer=producer,
                producerRound=producer_round,
            )
        credited = self._s.credited_by.get((consumer, producer, producer_round), 0) + count
        if credited > shared.rollout_count:
            raise reverted(
                "SapoLedgerCreditExceedsShared",
                producer=producer,
                producerRound=producer_round,
                credited=credited,
                shared=shared.rollout_count,
            )

    async def credited_by(self, consumer: str, producer: str, producer_round: int) -> int:
        """``SapoLedger.creditedBy``: rollouts of ``producer``'s round ``consumer`` credited."""
        await anyio.lowlevel.checkpoint()
        return self._s.credited_by.get((checksum(consumer), checksum(producer), producer_round), 0)
