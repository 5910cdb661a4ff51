"""web3 adapter of the ledger port: one class for the in-process EVM and any JSON-RPC chain.

Owns transaction building, local signing (keys never leave the process), EIP-712 relaying,
event queries and the translation of web3 / eth-tester / HTTP exceptions into
:class:`~sapo_async.errors.LedgerError` (the only place that knows those exception types).
Does not know about journals, retries or rounds beyond what the contract enforces: retrying
is the recorder's job.

Threading: web3 here is synchronous, so each call runs in a worker thread
(``anyio.to_thread``) under the :class:`Chain`'s lock; the event loop (and training) never
blocks on the chain, and eth-tester, which is not thread-safe, is only ever used by one
thread at a time. Every network call is bounded by ``LEDGER_RPC_TIMEOUT_S`` and every
receipt wait by ``LEDGER_TX_TIMEOUT_S``.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import requests
from eth_abi.abi import decode as abi_decode
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import (
    ContractCustomError,
    ContractLogicError,
    TimeExhausted,
    TransactionNotFound,
    Web3Exception,
)

from sapo_async import limits
from sapo_async.errors import CommitmentRejected, LedgerError, LedgerUnavailable
from sapo_async.ledger.artifacts import load_artifact
from sapo_async.ledger.signing import sign_commitment, sign_registration
from sapo_async.ledger.types import (
    CommitmentPayload,
    NodeStats,
    OnChainCommitment,
    SubmitReceipt,
    UsageCredit,
    checksum,
)
from sapo_async.logs import get_logger
from sapo_async.wire.rollout import keccak256

__all__ = ["Chain", "EvmLedger", "decode_revert"]

_T = TypeVar("_T")
_log = get_logger("ledger")


class Chain:
    """A web3 connection and the lock that serialises its use.

    Args:
        w3: a connected (or lazily connecting) web3 instance.
        kind: ``"embedded"`` or ``"rpc"``, for logs and audits.
        url: the RPC URL, when there is one.
    """

    def __init__(self, w3: Web3, *, kind: str, url: str | None = None) -> None:
        self.w3 = w3
        self.kind = kind
        self.url = url
        self.lock = threading.Lock()
        self._chain_id: int | None = None

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` in a worker thread holding the lock, translating errors."""

        def locked() -> _T:
            with self.lock, translate_errors():
                return fn(*args)

        return await anyio.to_thread.run_sync(locked)

    def chain_id_sync(self) -> int:
        """Chain id (cached after the first successful read). Caller holds the lock."""
        if self._chain_id is None:
            self._chain_id = int(self.w3.eth.chain_id)
        return self._chain_id

    def send_sync(self, account: LocalAccount, call: Any) -> SubmitReceipt:
        """Build, sign locally, send and wait for a contract call. Caller holds the lock.

        Raises:
            CommitmentRejected: the call reverts (at gas estimation or once mined).
        """
        params: dict[str, Any] = {
            "from": account.address,
            "nonce": self.w3.eth.get_transaction_count(account.address, "pending"),
            "chainId": self.chain_id_sync(),
        }
        if self.kind == "embedded" and hasattr(call, "call"):
            # py-evm estimates gas by a binary search (~14 executions, 80 % of a submit's
            # time). One eth_call surfaces any revert with its reason; a fixed limit then
            # covers the transaction (unused gas is refunded, so it costs nothing).
            call.call({"from": account.address})
            params["gas"] = limits.LEDGER_EMBEDDED_TX_GAS
        tx = call.build_transaction(params)
        signed = account.sign_transaction(tx)
        tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        receipt = self.w3.eth.wait_for_transaction_receipt(
            tx_hash, timeout=limits.LEDGER_TX_TIMEOUT_S, poll_latency=0.05
        )
        if receipt["status"] != 1:
            raise CommitmentRejected(
                f"transaction {tx_hash.hex()} reverted", tx_hash="0x" + tx_hash.hex()
            )
        return SubmitReceipt(
            tx_hash="0x" + bytes(receipt["transactionHash"]).hex(),
            block_number=int(receipt["blockNumber"]),
            gas_used=int(receipt["gasUsed"]),
            contract_address=receipt.get("contractAddress") or None,
        )


def _error_table() -> dict[bytes, tuple[str, list[str], list[str]]]:
    table: dict[bytes, tuple[str, list[str], list[str]]] = {}
    for name in ("SapoLedger",):
        for item in load_artifact(name).abi:
            if item["type"] != "error":
                continue
            types = [i["type"] for i in item["inputs"]]
            signature = f"{item['name']}({','.join(types)})"
            table[keccak256(signature.encode())[:4]] = (
                item["name"],
                types,
                [i["name"] for i in item["inputs"]],
            )
    return table


_ERRORS: dict[bytes, tuple[str, list[str], list[str]]] | None = None


def decode_revert(data: bytes) -> tuple[str, str]:
    """Decode revert data of the ledger into ``(error name, readable message)``.

    Unknown data decodes to ``("unknown", hex)``; ``Error(string)`` to ``("Error", text)``.
    """
    global _ERRORS  # noqa: PLW0603 - built once from the artifact, on first use
    if _ERRORS is None:
        _ERRORS = _error_table()
    selector, body = data[:4], data[4:]
    if selector == keccak256(b"Error(string)")[:4]:
        return "Error", str(abi_decode(["string"], body)[0])
    known = _ERRORS.get(selector)
    if known is None:
        return "unknown", "0x" + data.hex()
    name, types, names = known
    try:
        values = abi_decode(types, body)
    except Exception:  # malformed revert data still deserves a name
        return name, name
    shown = ", ".join(
        f"{n}={'0x' + v.hex() if isinstance(v, bytes) else v}"
        for n, v in zip(names, values, strict=True)
    )
    return name, f"{name}({shown})"


def _bytes_literal_start(text: str) -> int | None:
    """Where a Python bytes literal (``b'...'`` or ``b"..."``) starts in ``text``."""
    starts = [i for i in (text.find("b'"), text.find('b"')) if i >= 0]
    return min(starts) if starts else None


def _revert_data(exc: BaseException) -> bytes | None:
    data = getattr(exc, "data", None)
    if isinstance(data, str) and data.startswith("0x"):
        return bytes.fromhex(data[2:])
    if isinstance(data, bytes):
        return data
    for arg in exc.args:
        if isinstance(arg, bytes):
            return arg
        literal = _bytes_literal_start(arg) if isinstance(arg, str) else None
        if literal is not None:
            # eth-tester: "execution reverted: b'\x06\x83...'" (or b"..." when the bytes
            # contain a single quote, which depends on the values in the error)
            try:
                value = ast.literal_eval(arg[literal:])
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, bytes):
                return value
        if isinstance(arg, str) and arg.startswith("0x"):
            try:
                return bytes.fromhex(arg[2:])
            except ValueError:
                continue
    return None


def _is_revert(exc: BaseException) -> bool:
    if isinstance(exc, ContractCustomError | ContractLogicError):
        return True
    # eth-tester's TransactionFailed: matched by name so its import stays optional.
    return type(exc).__name__ == "TransactionFailed"


_FOREIGN_ROOTS = frozenset(
    {
        "web3",
        "eth_tester",
        "eth",
        "eth_utils",
        "eth_abi",
        "eth_account",
        "eth_keys",
        "requests",
        "urllib3",
        "hexbytes",
    }
)


def _is_foreign(exc: BaseException) -> bool:
    # Anything else raised from inside the web3 stack (RPC error payloads, eth-tester
    # validation, ...) is a ledger failure: the recorder retries it instead of letting the
    # chain take training down. Our own bugs (raised from sapo_async) still propagate.
    return type(exc).__module__.split(".")[0] in _FOREIGN_ROOTS


@contextmanager
def translate_errors() -> Iterator[None]:
    """Translate web3, eth-tester and HTTP errors raised inside into ``LedgerError``s."""
    try:
        yield
    except LedgerError:
        raise
    except (requests.exceptions.RequestException, OSError, TimeExhausted) as exc:
        raise LedgerUnavailable(f"chain unreachable: {exc}") from exc
    except Exception as exc:
        if _is_revert(exc):
            data = _revert_data(exc)
            name, message = decode_revert(data) if data else ("unknown", str(exc))
            raise CommitmentRejected(f"ledger reverted: {message}", reason=name) from exc
        if isinstance(exc, TransactionNotFound | Web3Exception) or _is_foreign(exc):
            raise LedgerError(f"ledger call failed: {type(exc).__name__}: {exc}") from exc
        raise


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
        fns = self._contract.functions
        if self.relayer is None or self.relayer.address == node.address:
            return self.chain.send_sync(node, fns.commit(payload.as_abi()))
        nonce = int(fns.nonces(node.address).call())
        signature = sign_commitment(node, self.chain.chain_id_sync(), self._address, payload, nonce)
        call = fns.commitBySig(node.address, payload.as_abi(), nonce, signature)
        return self.chain.send_sync(self.relayer, call)

    # ------------------------------------------------------------------ reads

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

    async def node_stats(self, node: str) -> NodeStats:
        """Running totals of ``node`` (zeros for an unknown address)."""

        def read() -> NodeStats:
            address = checksum(node)
            fns = self._contract.functions
            info = fns.nodeInfo(address).call()
            registered_at, rounds, last_round, rollouts, external, credit = info
            return NodeStats(
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
        call = self._contract.functions.isRolloutIncluded(
            checksum(node), round_, rollout_hash, list(proof)
        )
        return bool(await self.chain.run(call.call))

    async def is_external_included(
        self, node: str, round_: int, rollout_hash: bytes, proof: Sequence[bytes]
    ) -> bool:
        """Same for the external rollouts ``node`` trained on in ``round_``."""
        call = self._contract.functions.isExternalIncluded(
            checksum(node), round_, rollout_hash, list(proof)
        )
        return bool(await self.chain.run(call.call))

    async def credit_received(self, producer: str) -> int:
        """Rollouts of ``producer`` that other nodes reported training on."""
        call = self._contract.functions.creditReceived(checksum(producer))
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
