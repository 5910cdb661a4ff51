"""web3 adapter of the ledger port: the ``SapoLedger`` contract's calls, views and events.

Owns building the contract's calls (direct, or relayed with the node's EIP-712 signature),
reading its views and events into the port's value types. Does not know about journals,
retries or rounds beyond what the contract enforces (retrying is the recorder's job), nor
about web3's exceptions and threads: every call goes through :meth:`Chain.run`
(:mod:`sapo_async.ledger.chain`), which runs it in a worker thread and translates errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from eth_account.signers.local import LocalAccount
from web3 import Web3

from sapo_async import limits
from sapo_async.errors import CommitmentRejected, LedgerError
from sapo_async.ledger.artifacts import load_artifact
from sapo_async.ledger.chain import Chain, translate_errors
from sapo_async.ledger.evm_calls import Signed, batch_call, headroom, per_round, sign_batch
from sapo_async.ledger.signing import sign_registration
from sapo_async.ledger.types import (
    MAX_BATCH,
    CommitmentPayload,
    OnChainCommitment,
    OnChainTotals,
    SubmitReceipt,
    UsageCredit,
    checksum,
)
from sapo_async.logs import get_logger

# Chain is re-exported: deploy, embedded and rpc callers import it from here.
__all__ = ["EvmLedger"]

_log = get_logger("ledger")


class EvmLedger:
    """A deployed ``SapoLedger`` reached through web3; implements :class:`Ledger`.

    Args:
        chain: the connection (embedded or JSON-RPC).
        address: the ledger contract's address.
        relayer: account that sends (and pays for) transactions on behalf of nodes, using
            their EIP-712 signatures. None: each node sends its own transactions.
        from_block: first block to scan for events (the deployment block).
    """

    def __init__(
        self,
        chain: Chain,
        address: str,
        *,
        relayer: LocalAccount | None = None,
        from_block: int = 0,
    ) -> None:
        self.chain = chain
        self._address = checksum(address)
        self.relayer = relayer
        self.from_block = from_block
        self._contract = chain.w3.eth.contract(
            address=Web3.to_checksum_address(self._address), abi=load_artifact("SapoLedger").abi
        )

    @property
    def address(self) -> str:
        """Checksummed address of the ledger contract."""
        return self._address

    @property
    def chain_id(self) -> int:
        """Chain id, cached after the first read.

        The first read blocks the caller on the chain (use :meth:`get_chain_id` from async
        code); every submit caches it anyway.
        """
        if self.chain._chain_id is not None:
            return self.chain._chain_id
        with self.chain.lock, translate_errors():
            return self.chain.chain_id_sync()

    async def get_chain_id(self) -> int:
        """Chain id, read in a worker thread on first use."""
        return await self.chain.run(self.chain.chain_id_sync)

    # ------------------------------------------------------------------ writes

    async def register(self, node: LocalAccount, metadata: str = "") -> bool:
        """Register ``node`` unless it already is.

        Returns:
            True if this call registered the node, False if it already was.

        Raises:
            LedgerUnavailable: the chain cannot be reached.
            CommitmentRejected: the chain refused the registration.
        """
        return await self.chain.run(self._register_sync, node, metadata)

    def _register_sync(self, node: LocalAccount, metadata: str) -> bool:
        fns = self._contract.functions
        if fns.isRegistered(node.address).call():
            return False
        if self.relayer is None or self.relayer.address == node.address:
            self.chain.send_sync(node, fns.register(metadata))
        else:
            nonce = int(fns.nonces(node.address).call())
            signature = sign_registration(
                node, self.chain.chain_id_sync(), self._address, metadata, nonce
            )
            self.chain.send_sync(
                self.relayer, fns.registerBySig(node.address, metadata, nonce, signature)
            )
        _log.info("node_registered", node=node.address, ledger=self._address)
        return True

    async def submit(self, node: LocalAccount, payload: CommitmentPayload) -> SubmitReceipt:
        """Send ``node``'s commitment: directly, or through the relayer with its signature.

        Raises:
            LedgerUnavailable: the chain cannot be reached.
            CommitmentRejected: the contract reverted (``reason`` names its custom error,
                e.g. ``SapoLedgerRoundNotIncreasing`` for a round already landed).
        """
        return await self.chain.run(self._submit_sync, node, payload)

    def _submit_sync(self, node: LocalAccount, payload: CommitmentPayload) -> SubmitReceipt:
        return self._batch_sync(node, [payload])[0]

    async def submit_batch(
        self, node: LocalAccount, payloads: Sequence[CommitmentPayload]
    ) -> list[SubmitReceipt]:
        """Send ``node``'s commitments (ascending rounds) as one ``commitMany`` transaction
        (one alone as ``commit``; relayed, ``commitManyBySig`` with the node's signature of
        each round): every one lands, in order, in one block, or none does.

        Returns:
            one receipt per commitment: the transaction's hash and block, that round's
            claims, and the transaction's gas shared evenly.

        Raises:
            LedgerUnavailable: the chain cannot be reached.
            CommitmentRejected: a rule refused one of them, so none landed (``reason`` names
                its custom error; ``SapoLedgerBatchLength`` for none or above ``MAX_BATCH``).
        """
        return await self.chain.run(self._batch_sync, node, list(payloads))

    async def submit_many(
        self, node: LocalAccount, payloads: Sequence[CommitmentPayload]
    ) -> list[SubmitReceipt | LedgerError]:
        """Send up to ``MAX_BATCH`` of ``node``'s commitments (ascending rounds): the longest
        prefix the chain accepts as one :meth:`submit_batch` (found by simulating prefixes
        against the pending block, a binary search, when the whole is refused), then the
        refusal of the next one. Relayed, the node signs each round (consecutive nonces) and
        the relayer sends them as one ``commitManyBySig``.

        Returns:
            one outcome per commitment sent, in order: receipts, then possibly one error
            (the first refused, or for the first of them when the batch was not seen
            landing: mined and reverted, or the chain unreachable).
        """
        return await self.chain.run(self._many_sync, node, list(payloads[:MAX_BATCH]))

    def _many_sync(
        self, node: LocalAccount, payloads: list[CommitmentPayload]
    ) -> list[SubmitReceipt | LedgerError]:
        if not payloads:
            return []
        try:
            signed = self._signed(node, payloads)
            return list(self._batch_sync(node, payloads, signed))
        except CommitmentRejected as exc:
            if exc.tx_hash is not None:  # mined and reverted, all of it: no verdict on one
                return [exc]
            refused = exc
        except LedgerError as exc:
            return [exc]
        try:
            good, refused = self._landing_prefix(node, payloads, signed, refused)
            landed = self._batch_sync(node, payloads[:good], signed) if good else []
        except LedgerError as exc:
            return [exc]
        return [*landed, refused]

    def _landing_prefix(
        self,
        node: LocalAccount,
        payloads: list[CommitmentPayload],
        signed: Signed | None,
        refused: CommitmentRejected,
    ) -> tuple[int, CommitmentRejected]:
        """The longest prefix of ``payloads`` whose batch the pending block accepts, and the
        refusal of the one after it. A batch is refused exactly when one of its commitments
        is, given the ones before it, so acceptance only shrinks as the prefix grows."""
        good, bad = 0, len(payloads)  # the empty prefix is accepted, the whole one refused
        sender = self._sender(node)
        while bad - good > 1:
            mid = (good + bad) // 2
            try:
                call = batch_call(self._contract.functions, node.address, payloads[:mid], signed)
                self.chain.simulate_sync(sender, call)
            except CommitmentRejected as exc:
                bad, refused = mid, exc
            else:
                good = mid
        return good, refused

    def _sender(self, node: LocalAccount) -> LocalAccount:
        """Who sends ``node``'s transactions: the relayer, if there is one, else the node."""
        return node if self.relayer is None else self.relayer

    def _signed(self, node: LocalAccount, payloads: Sequence[CommitmentPayload]) -> Signed | None:
        """Relayed: the node's next nonce and its signature of each commitment. Direct: None."""
        if self._sender(node).address == node.address:
            return None
        nonce = int(self._contract.functions.nonces(node.address).call())
        return sign_batch(node, self.chain.chain_id_sync(), self._address, nonce, payloads)

    def _batch_sync(
        self, node: LocalAccount, payloads: list[CommitmentPayload], signed: Signed | None = None
    ) -> list[SubmitReceipt]:
        signed = signed if signed is not None else self._signed(node, payloads)
        call = batch_call(self._contract.functions, node.address, payloads, signed)
        sender, weight = self._sender(node), len(payloads)
        return per_round(
            self.chain.send_sync(sender, call, headroom(payloads), weight=weight), payloads
        )

    async def submit_signed(
        self, node: str, payload: CommitmentPayload, nonce: int, signature: bytes
    ) -> SubmitReceipt:
        """Relay a commitment ``node`` signed elsewhere (``commitBySig``), sent by the relayer.

        Raises:
            LedgerError: this client has no relayer.
            LedgerUnavailable: the chain cannot be reached.
            CommitmentRejected: the contract reverted (``SapoLedgerInvalidSigner`` for a
                signature of another key, ``InvalidAccountNonce`` for a used nonce, or any
                of the commitment rules).
        """
        return await self.chain.run(self._relay_sync, checksum(node), payload, nonce, signature)

    def _relay_sync(
        self, node: str, payload: CommitmentPayload, nonce: int, signature: bytes
    ) -> SubmitReceipt:
        if self.relayer is None:
            raise LedgerError("relaying a signed commitment needs a client with a relayer")
        call = batch_call(self._contract.functions, node, [payload], (nonce, [signature]))
        return self.chain.send_sync(self.relayer, call, headroom([payload]))

    async def settle_credit(
        self, sender: LocalAccount, consumer: str, round_: int, producer: str, producer_round: int
    ) -> SubmitReceipt:
        """Credit ``consumer``'s claim of its round ``round_`` on ``producer``'s round
        ``producer_round`` (``settleCredit``; anyone may call it). Sent by the relayer if
        there is one, else by ``sender``.

        Raises:
            LedgerUnavailable: the chain cannot be reached.
            CommitmentRejected: ``SapoLedgerNothingToSettle`` (no such claim, or already
                settled), ``SapoLedgerProducerRoundNotCommitted`` (not on chain yet, or it
                shared nothing), ``SapoLedgerCreditExceedsShared``.
        """
        call = self._contract.functions.settleCredit(
            checksum(consumer), round_, checksum(producer), producer_round
        )
        account = self.relayer if self.relayer is not None else sender
        return await self.chain.run(self.chain.send_sync, account, call)

    async def settle_credits(
        self, sender: LocalAccount, claims: Sequence[tuple[str, int, str, int]]
    ) -> list[SubmitReceipt]:
        """Settle several claims, each (consumer, round, producer, producer round), in one
        ``settleCredits`` transaction: all or none. Sent as :meth:`settle_credit` is.

        Returns:
            one receipt per claim (the transaction's, its gas shared evenly).

        Raises:
            LedgerUnavailable: the chain cannot be reached.
            CommitmentRejected: one claim was refused (any error of :meth:`settle_credit`),
                so none was settled; ``SapoLedgerBatchLength`` for none or above ``MAX_BATCH``.
        """
        keys = [(checksum(c), r, checksum(p), pr) for c, r, p, pr in claims]
        call = self._contract.functions.settleCredits(keys)
        account = self.relayer if self.relayer is not None else sender
        receipt = await self.chain.run(self.chain.send_sync, account, call, 0)
        share = replace(receipt, gas_used=receipt.gas_used // max(1, len(keys)))
        return [share] * len(keys)

    # ------------------------------------------------------------------ reads

    async def claim_of(self, consumer: str, round_: int, producer: str, producer_round: int) -> int:
        """Unsettled rollouts ``consumer`` claimed in ``round_`` on ``producer``'s round
        ``producer_round`` (``claimOf``; 0: no claim, or settled)."""
        call = self._contract.functions.claimOf(
            checksum(consumer), round_, checksum(producer), producer_round
        )
        return int(await self.chain.run(call.call))

    async def commitment_of(self, node: str, round_: int) -> OnChainCommitment | None:
        """The stored commitment of ``node`` for ``round_``, or None if there is none."""

        def read() -> OnChainCommitment | None:
            c = self._contract.functions.commitmentOf(checksum(node), round_).call()
            if c[5] == 0:
                return None
            return OnChainCommitment(
                node=checksum(node),
                round=round_,
                rollout_root=bytes(c[0]),
                external_root=bytes(c[1]),
                policy_version=int(c[2]),
                rollout_count=int(c[3]),
                external_count=int(c[4]),
                block_number=int(c[5]),
                timestamp=int(c[6]),
            )

        return await self.chain.run(read)

    async def node_stats(self, node: str) -> OnChainTotals:
        """Running totals of ``node`` (zeros for an unknown address)."""

        def read() -> OnChainTotals:
            address = checksum(node)
            fns = self._contract.functions
            info = fns.nodeInfo(address).call()
            registered_at, rounds, last_round, rollouts, external, credit = info
            return OnChainTotals(
                node=address,
                registered=registered_at != 0,
                metadata=str(fns.metadataOf(address).call()),
                rounds_committed=int(rounds),
                last_round=int(last_round) if rounds else None,
                rollouts_committed=int(rollouts),
                external_used=int(external),
                credit_received=int(credit),
            )

        return await self.chain.run(read)

    async def nodes(self) -> list[str]:
        """Every registered node, in registration order."""

        def read() -> list[str]:
            fns = self._contract.functions
            count = int(fns.nodeCount().call())
            page = limits.LEDGER_VIEW_PAGE
            found: list[str] = []
            for offset in range(0, count, page):
                found.extend(checksum(a) for a in fns.nodes(offset, page).call())
            return found

        return await self.chain.run(read)

    async def rounds_of(self, node: str) -> list[int]:
        """Rounds ``node`` committed, ascending."""

        def read() -> list[int]:
            fns = self._contract.functions
            address = checksum(node)
            count = int(fns.roundCount(address).call())
            page = limits.LEDGER_VIEW_PAGE
            found: list[int] = []
            for offset in range(0, count, page):
                found.extend(int(r) for r in fns.roundsOf(address, offset, page).call())
            return found

        return await self.chain.run(read)

    async def is_rollout_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Ask the contract whether ``proof`` shows ``rollout_hash`` in ``node``'s round."""
        return await self._included("isRolloutIncluded", node, round_, rollout_hash, proof)

    async def is_external_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Same for the external rollouts ``node`` trained on in ``round_``."""
        return await self._included("isExternalIncluded", node, round_, rollout_hash, proof)

    async def _included(
        self, view: str, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        call = self._contract.functions[view](checksum(node), round_, rollout_hash, list(proof))
        return bool(await self.chain.run(call.call))

    async def commitment_digest(self, node: str, payload: CommitmentPayload, nonce: int) -> bytes:
        """The EIP-712 digest ``node`` signs to have ``payload`` relayed with ``nonce``,
        as the contract computes it (``commitmentDigest``)."""
        call = self._contract.functions.commitmentDigest(checksum(node), payload.as_abi(), nonce)
        return bytes(await self.chain.run(call.call))

    async def credit_received(self, producer: str) -> int:
        """Rollouts of ``producer`` that other nodes reported training on."""
        call = self._contract.functions.creditReceived(checksum(producer))
        return int(await self.chain.run(call.call))

    async def credited_by(self, consumer: str, producer: str, producer_round: int) -> int:
        """Rollouts of ``producer``'s round ``producer_round`` that ``consumer`` has credited."""
        call = self._contract.functions.creditedBy(
            checksum(consumer), checksum(producer), producer_round
        )
        return int(await self.chain.run(call.call))

    async def nonce(self, node: str) -> int:
        """Next EIP-712 nonce of ``node``."""
        return int(await self.chain.run(self._contract.functions.nonces(checksum(node)).call))

    async def usage_credits(
        self, *, producer: str | None = None, consumer: str | None = None
    ) -> list[UsageCredit]:
        """``UsageCredited`` events, optionally filtered, oldest first."""
        filters: dict[str, str] = {}
        if producer is not None:
            filters["producer"] = checksum(producer)
        if consumer is not None:
            filters["consumer"] = checksum(consumer)

        def read() -> list[UsageCredit]:
            logs = self._contract.events.UsageCredited.get_logs(
                from_block=self.from_block, argument_filters=filters or None
            )
            return [
                UsageCredit(
                    producer=checksum(log["args"]["producer"]),
                    consumer=checksum(log["args"]["consumer"]),
                    round=int(log["args"]["round"]),
                    count=int(log["args"]["count"]),
                    block_number=int(log["blockNumber"]),
                    producer_round=int(log["args"]["producerRound"]),
                )
                for log in logs
            ]

        return await self.chain.run(read)

    async def commitments(self, node: str | None = None) -> list[OnChainCommitment]:
        """Every ``CommitmentRecorded`` event (optionally of one node), oldest first."""
        filters = {"node": checksum(node)} if node is not None else None

        def read() -> list[OnChainCommitment]:
            logs = self._contract.events.CommitmentRecorded.get_logs(
                from_block=self.from_block, argument_filters=filters
            )
            out = []
            timestamps: dict[int, int] = {}
            for log in logs:
                a = log["args"]
                number = int(log["blockNumber"])
                if number not in timestamps:
                    timestamps[number] = int(self.chain.w3.eth.get_block(number)["timestamp"])
                out.append(
                    OnChainCommitment(
                        node=checksum(a["node"]),
                        round=int(a["round"]),
                        policy_version=int(a["policyVersion"]),
                        rollout_root=bytes(a["rolloutRoot"]),
                        rollout_count=int(a["rolloutCount"]),
                        external_root=bytes(a["externalRoot"]),
                        external_count=int(a["externalCount"]),
                        block_number=number,
                        timestamp=timestamps[number],
                    )
                )
            return out

        return await self.chain.run(read)
