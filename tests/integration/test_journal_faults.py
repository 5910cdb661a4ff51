"""Exactly once through every failure of a node's own storage (issue 55, item 1).

A real node (the tiny model, a real SQLite journal and checkpoints on disk, the embedded
EVM) is hit, at one round, by one fault between the round's end, its checkpoint and its
journal write; it fails or is stopped, starts again on the same data, and runs on. Then
its journal holds rounds 0..N-1 with no gap, each landed on chain with the journal's
body, so every round whose groups were published reaches the chain exactly once.

Before the fix, a commitment taken from the hold and refused by the journal (locked, full)
was lost while the checkpoint after it was written: the journal held rounds 0, 1, 3, 4.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from eth_account import Account

from sapo_async.errors import CheckpointError, JournalError, SapoError
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.node.embedded import EMBEDDED
from sapo_async.node.learner import Learner
from sapo_async.node.swarm import Swarm
from sapo_async.wire import keccak256

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.evm]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


FAULT_ROUND = 2
"""The round whose commitment meets the fault (its checkpoint is written every round)."""


def _settings(tmp_path: Path, swarm: str, broker: MemoryBroker) -> dict[str, Any]:
    return {
        "swarm": swarm,
        "model": "tiny",
        "regime": "dense",
        "questions_per_round": 2,
        "completions_per_question": 4,
        "local": 2,
        "external": 0,
        "name": "n0",
        "node_index": 0,
        "account": Account.from_key(keccak256(f"{swarm}:0".encode())),
        "transport": broker.connect(swarm),
        "checkpoint_dir": tmp_path / "checkpoints",
        "checkpoint_every": 1,
        "ledger_journal_path": tmp_path / "journal.sqlite",
        "drain_timeout_s": 60,
    }


@contextmanager
def patched_append(fault: Callable[[Any, Callable[[], bool]], bool]) -> Iterator[None]:
    """Route ``Journal.append`` through ``fault(commitment, original)`` while inside."""
    original = Journal.append

    def append(self: Journal, commitment: Any) -> bool:
        with self._guard("write"):  # where the journal meets sqlite3's errors
            return fault(commitment, lambda: original(self, commitment))

    Journal.append = append  # type: ignore[method-assign]
    try:
        yield
    finally:
        Journal.append = original  # type: ignore[method-assign]


def _sqlite_error(code: int, text: str) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = code  # type: ignore[attr-defined] # as sqlite3 sets it
    return exc


class LockAtRound:
    """Another program takes the journal's write lock (``BEGIN EXCLUSIVE``) when the node
    journals ``FAULT_ROUND``; ``refused`` is set once the node's write met the lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.refused = threading.Event()
        self.other: sqlite3.Connection | None = None

    def __call__(self, commitment: Any, original: Callable[[], bool]) -> bool:
        if commitment.round == FAULT_ROUND and self.other is None:
            self.other = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.other.execute("BEGIN EXCLUSIVE")
        try:
            return original()
        except JournalError as exc:
            if "locked" in str(exc):
                self.refused.set()
            raise

    async def wait_refused(self) -> None:
        assert await anyio.to_thread.run_sync(self.refused.wait, 120), "never locked out"

    def unlock(self) -> None:
        if self.other is not None:
            self.other.execute("COMMIT")
            self.other.close()


async def _run(settings: dict[str, Any], rounds: int) -> tuple[int, BaseException | None]:
    """Run the node for ``rounds`` rounds (or until it fails); its next round and failure."""
    failure: BaseException | None = None
    async with Swarm.join(rounds=rounds, **settings) as node:
        try:
            async for _ in node.rounds():
                pass
        except SapoError as exc:
            failure = exc
        await node.round_loop.wait_done()
        next_round = node.round_loop.learner.round
    return next_round, failure


def _journaled(settings: dict[str, Any]) -> list[int]:
    with Journal(settings["ledger_journal_path"]) as journal:
        return [e.round for e in journal.entries(settings["account"].address)]


async def _check_exactly_once(settings: dict[str, Any], next_round: int) -> None:
    """Every round before ``next_round`` is journaled once, landed, and on chain as is."""
    handle = await EMBEDDED.acquire_ledger(settings["swarm"])
    try:
        address = settings["account"].address
        with Journal(settings["ledger_journal_path"]) as journal:
            entries = journal.entries(address)
        assert [e.round for e in entries] == list(range(next_round))
        assert all(e.state is EntryState.LANDED for e in entries), [
            (e.round, e.state) for e in entries
        ]
        for entry in entries:
            stored = await handle.ledger.commitment_of(address, entry.round)
            assert stored is not None, entry.round
            assert stored.matches(entry.commitment.payload()), entry.round
    finally:
        await EMBEDDED.release_ledger(settings["swarm"])


async def _with_chain(swarm: str, body: Callable[[], Any]) -> None:
    # The embedded chain lives while someone holds it: across the node's restarts here.
    await EMBEDDED.acquire_ledger(swarm)
    try:
        await body()
    finally:
        await EMBEDDED.release_ledger(swarm)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cause", ["full", "read_only", "io"])
async def test_a_journal_that_cannot_be_written_stops_the_node_and_loses_no_commitment(
    tmp_path: Path, cause: str
) -> None:
    code = {"full": 13, "read_only": 8, "io": 10}[cause]
    swarm = f"journal-{cause.replace('_', '-')}"
    settings = _settings(tmp_path, swarm, MemoryBroker())

    def fault(commitment: Any, original: Callable[[], bool]) -> bool:
        if commitment.round == FAULT_ROUND:
            raise _sqlite_error(code, f"injected {cause}")
        return original()

    async def body() -> None:
        with patched_append(fault):
            stopped_at, stopped_by = await _run(settings, rounds=5)
        next_round, failure = await _run(settings, rounds=2)
        assert failure is None
        await _check_exactly_once(settings, next_round)
        assert stopped_at == FAULT_ROUND + 1  # no new round after the journal failed
        assert next_round == stopped_at + 2
        assert isinstance(stopped_by, SapoError)
        assert isinstance(stopped_by.__cause__, JournalError)
        assert stopped_by.__cause__.cause == cause
        assert str(settings["ledger_journal_path"]) in str(stopped_by)

    await _with_chain(swarm, body)


@pytest.mark.timeout(600)
async def test_a_node_waits_out_a_locked_journal_and_goes_on(tmp_path: Path) -> None:
    swarm = "journal-locked"
    settings = _settings(tmp_path, swarm, MemoryBroker())
    lock = LockAtRound(settings["ledger_journal_path"])

    async def body() -> None:
        async with anyio.create_task_group() as tg:

            async def unlock() -> None:
                try:
                    await lock.wait_refused()
                finally:
                    lock.unlock()

            tg.start_soon(unlock)
            with patched_append(lock):
                next_round, failure = await _run(settings, rounds=5)
        assert failure is None
        assert lock.refused.is_set()
        assert next_round == 5
        await _check_exactly_once(settings, next_round)

    await _with_chain(swarm, body)


@pytest.mark.timeout(600)
async def test_a_node_stopped_while_its_journal_is_locked_journals_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    swarm = "journal-locked-stop"
    settings = _settings(tmp_path, swarm, MemoryBroker())
    lock = LockAtRound(settings["ledger_journal_path"])

    async def body() -> None:
        with patched_append(lock):
            async with Swarm.join(rounds=5, **settings) as node:
                await lock.wait_refused()
                node.request_stop()  # the volunteer's Ctrl-C while the journal is locked
                with anyio.fail_after(120):
                    await node.round_loop.wait_done()
                stopped_at = node.round_loop.learner.round
        lock.unlock()
        assert _journaled(settings) == list(range(FAULT_ROUND))  # the held one: checkpoint
        next_round, failure = await _run(settings, rounds=2)
        assert failure is None
        assert next_round == stopped_at + 2
        await _check_exactly_once(settings, next_round)

    await _with_chain(swarm, body)


@pytest.mark.timeout(600)
async def test_a_checkpoint_that_fails_holds_the_commitment_and_the_round_is_redone(
    tmp_path: Path,
) -> None:
    swarm = "journal-checkpoint-fails"
    settings = _settings(tmp_path, swarm, MemoryBroker())
    original = Learner.save

    def save(self: Learner, directory: Path, extra: Any = None) -> Path:
        if self.round == FAULT_ROUND + 1:
            raise CheckpointError(f"injected: writing checkpoint in {directory} failed")
        return original(self, directory, extra)

    async def body() -> None:
        Learner.save = save  # type: ignore[method-assign]
        try:
            _, failure = await _run(settings, rounds=5)
        finally:
            Learner.save = original  # type: ignore[method-assign]
        assert isinstance(failure, SapoError)
        assert _journaled(settings) == list(range(FAULT_ROUND))  # round 2's: no checkpoint
        next_round, failure = await _run(settings, rounds=2)
        assert failure is None
        assert next_round == FAULT_ROUND + 2  # resumed at round 2 (its checkpoint failed)
        await _check_exactly_once(settings, next_round)

    await _with_chain(swarm, body)
