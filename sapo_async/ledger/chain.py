"""The web3 connection of the EVM ledger: one lock, worker threads, and error translation.

Owns the :class:`Chain` (a web3 instance, the lock that serialises its use, transaction
sending with local signing) and the translation of web3 / eth-tester / HTTP exceptions into
:class:`~sapo_async.errors.LedgerError`, including decoding the contract's custom errors
from revert data. It is the only module that knows those foreign exception types. It does
not know the ledger contract's functions: :mod:`sapo_async.ledger.evm` builds the calls.

Threading: web3 here is synchronous, so each call runs in a worker thread
(``anyio.to_thread``) under the chain's lock; the event loop (and training) never blocks on
the chain, and eth-tester, which is not thread-safe, is only ever used by one thread at a
time. Every network call is bounded by ``LEDGER_RPC_TIMEOUT_S`` and every receipt wait by
``LEDGER_TX_TIMEOUT_S``.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import requests
from eth_abi.abi import decode as abi_decode
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
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
from sapo_async.ledger.types import SubmitReceipt, checksum
from sapo_async.wire.rollout import keccak256

__all__ = ["Chain", "decode_revert", "reverted", "translate_errors"]

_T = TypeVar("_T")


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

    def send_sync(
        self, account: LocalAccount, call: Any, headroom: int = 0, *, weight: int = 1
    ) -> SubmitReceipt:
        """Build, sign locally, send and wait for a contract call. Caller holds the lock.

        The call is simulated (its gas estimated) against the *pending* block, which holds
        every transaction already waiting (this account's and others'). Its gas limit is the
        estimate plus ``headroom``: a commitment estimated while a producer round it credits
        was missing (a claim) costs more once that round lands ahead of it in the same block
        (a credit), and without headroom runs out of gas, reverting without a reason.

        Args:
            headroom: gas added to the estimate.
            weight: commitments the call carries (the embedded chain, which skips the
                estimate, gives each ``LEDGER_EMBEDDED_TX_GAS``, up to its block's limit).

        Raises:
            CommitmentRejected: the call reverts: refused by its simulation (``tx_hash``
                None, ``reason`` the contract's error; on the embedded chain, simulated
                after it was mined and reverted), or mined and reverted (``tx_hash`` set, no
                reason: the state moved between the simulation and the block).
            LedgerUnavailable: the chain is unreachable, or the receipt not seen in time.
        """
        with translate_errors():
            nonce = self.w3.eth.get_transaction_count(account.address, "pending")
            tx_hash = self._send_raw(account, call, nonce, headroom, weight)
            try:
                return self._receipt(tx_hash)
            except CommitmentRejected:
                if self.kind == "embedded" and hasattr(call, "call"):
                    # Mined at once under this lock, so the state is the one it reverted
                    # against: one call names the contract's reason (raised, translated).
                    call.call({"from": account.address})
                raise

    def simulate_sync(self, account: LocalAccount, call: Any) -> None:
        """Run ``call`` from ``account`` against the pending block without sending it.
        Caller holds the lock.

        Raises:
            CommitmentRejected: it would revert (``reason`` names the contract's error).
        """
        with translate_errors():
            if self.kind == "embedded":
                call.call({"from": account.address})
            else:
                call.estimate_gas({"from": account.address}, block_identifier="pending")

    def _send_raw(
        self, account: LocalAccount, call: Any, nonce: int, headroom: int, weight: int
    ) -> HexBytes:
        params: dict[str, Any] = {
            "from": account.address,
            "nonce": nonce,
            "chainId": self.chain_id_sync(),
        }
        if self.kind == "embedded":
            # Mined at once, so nothing is pending. py-evm estimates gas by a binary search
            # (~14 executions, 80 % of a submit's time), and even one simulation first doubles
            # the cost of every transaction (the README's swarm keeps the chain's lock ~80 %
            # busy): a fixed limit covers the transaction (unused gas is refunded), and only
            # a transaction that reverts is simulated, after, for its reason (send_sync). A
            # deployment is estimated by web3 as it builds it.
            if hasattr(call, "call"):
                params["gas"] = min(
                    limits.LEDGER_EMBEDDED_TX_GAS * max(1, weight), limits.LEDGER_EMBEDDED_BLOCK_GAS
                )
        else:
            estimate = call.estimate_gas({"from": account.address}, block_identifier="pending")
            params["gas"] = int(estimate) + headroom
        tx = call.build_transaction(params)
        signed = account.sign_transaction(tx)
        return self.w3.eth.send_raw_transaction(signed.raw_transaction)

    def _receipt(self, tx_hash: HexBytes) -> SubmitReceipt:
        receipt = self.w3.eth.wait_for_transaction_receipt(
            tx_hash, timeout=limits.LEDGER_TX_TIMEOUT_S, poll_latency=0.05
        )
        claims = _claims_in(receipt)
        if receipt["status"] != 1:
            raise CommitmentRejected(
                f"transaction {tx_hash.hex()} reverted", tx_hash="0x" + tx_hash.hex()
            )
        return SubmitReceipt(
            tx_hash="0x" + bytes(receipt["transactionHash"]).hex(),
            block_number=int(receipt["blockNumber"]),
            gas_used=int(receipt["gasUsed"]),
            contract_address=receipt.get("contractAddress") or None,
            claimed=tuple((producer, r) for _, producer, r in claims),
            claim_rounds=tuple(round_ for round_, _, _ in claims),
        )


_USAGE_CLAIMED = keccak256(b"UsageClaimed(address,address,uint64,uint64,uint32)")


def _claims_in(receipt: Any) -> list[tuple[int, str, int]]:
    """(consumer round, producer, producer round) of each ``UsageClaimed`` log of
    ``receipt``: topic 1 is the producer, topic 3 the consumer's round, the data's first word
    the producer round (the event's ABI)."""
    found = []
    for log in receipt.get("logs") or ():
        topics = [bytes(t) for t in log["topics"]]
        if topics and topics[0] == _USAGE_CLAIMED:
            data = bytes(log["data"])
            producer = checksum("0x" + topics[1][-20:].hex())
            found.append((int.from_bytes(topics[3]), producer, int.from_bytes(data[:32])))
    return found


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
    return name, _format_error(name, zip(names, values, strict=True))


def _format_error(name: str, fields: Iterable[tuple[str, object]]) -> str:
    shown = ", ".join(f"{n}={'0x' + v.hex() if isinstance(v, bytes) else v}" for n, v in fields)
    return f"{name}({shown})"


def reverted(name: str, **fields: object) -> CommitmentRejected:
    """The error a revert with the contract's custom error ``name(fields)`` translates to.

    Backends that enforce the contract's rules without an EVM (the memory ledger) raise this,
    so callers see the same ``reason`` and message whichever backend refused.
    """
    return CommitmentRejected(
        f"ledger reverted: {_format_error(name, fields.items())}", reason=name
    )


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
