"""The SQLite journal: durability, idempotency, ordering, rollout index (no chain)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from sapo_async.errors import RejectedInput
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ledger.types import RoundCommitment
from tests.fixtures.ledger import SlowFsyncJournal

NODE = "0x" + "aB" * 20
OTHER = "0x" + "c0" * 20


def rc(round_: int, n: int = 2, **kw) -> RoundCommitment:
    return RoundCommitment(NODE, round_, round_, [os.urandom(32) for _ in range(n)], **kw)


def test_entries_survive_reopening(tmp_path: Path):
    path = tmp_path / "deep" / "journal.sqlite"
    with Journal(path) as j:
        first, second = rc(1), rc(2)
        assert j.append(first)
        assert j.append(second)
        j.mark_landed(NODE, 1, tx_hash="0xab", block_number=7)
    with Journal(path) as j:
        assert [e.commitment for e in j.pending()] == [second]
        landed = j.entry(NODE, 1)
        assert landed is not None
        assert landed.commitment == first
        assert (landed.state, landed.tx_hash, landed.block_number) == (EntryState.LANDED, "0xab", 7)


def test_reappending_the_same_commitment_is_a_no_op(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as j:
        c = rc(3)
        assert j.append(c)
        assert not j.append(c)
        assert len(j.entries()) == 1


def test_a_different_commitment_for_a_journaled_round_is_rejected(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as j:
        j.append(rc(3))
        with pytest.raises(RejectedInput) as info:
            j.append(rc(3))
        assert info.value.reason == "conflicting_commitment"


def test_rounds_must_increase_per_node(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as j:
        j.append(rc(5))
        with pytest.raises(RejectedInput) as info:
            j.append(rc(4))
        assert info.value.reason == "round_not_increasing"
        j.append(RoundCommitment(OTHER, 1, 1))  # another node has its own sequence


def test_states_only_leave_pending_once(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as j:
        j.append(rc(1))
        j.record_attempt(NODE, 1, "LedgerUnavailable: down")
        j.mark_failed(NODE, 1, "superseded")
        j.mark_landed(NODE, 1, tx_hash="0x1", block_number=1)  # ignored: not pending
        entry = j.entry(NODE, 1)
        assert entry is not None
        assert (entry.state, entry.attempts, entry.last_error) == (
            EntryState.FAILED,
            1,
            "superseded",
        )
        assert j.counts() == {EntryState.PENDING: 0, EntryState.LANDED: 0, EntryState.FAILED: 1}


def test_rollout_hashes_are_indexed_by_kind(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as j:
        shared = os.urandom(32)
        c = RoundCommitment(NODE, 1, 1, [shared], {OTHER: {1: [os.urandom(32)]}})
        j.append(c)
        j.append(RoundCommitment(OTHER, 4, 1, [], {NODE: {1: [shared]}}))
        found = j.find_rollout(shared)
        assert [(f.node.lower(), f.round, f.kind) for f in found] == [
            (NODE.lower(), 1, "own"),
            (OTHER, 4, "external"),
        ]
        assert j.find_rollout(os.urandom(32)) == []


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_write_waiting_on_its_fsync_leaves_the_event_loop_free(tmp_path: Path):
    with SlowFsyncJournal(tmp_path / "j.sqlite") as j:
        written = anyio.Event()

        async def append() -> None:
            assert await j.write(j.append, rc(1))
            written.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            assert await anyio.to_thread.run_sync(j.syncing.wait, 10)
            # The commit is held in the writer thread, and this task still runs: the loop is
            # free. Reads use their own connection, so they do not wait for it either.
            assert not written.is_set()
            assert j.pending() == []
            j.release.set()
            with anyio.fail_after(10):
                await written.wait()
        assert [e.round for e in j.pending()] == [1]


@pytest.mark.anyio
async def test_writes_through_the_writer_keep_their_order_and_errors(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as j:
        assert await j.write(j.append, rc(1))
        assert await j.write(j.append, rc(2))
        await j.write(j.mark_landed, NODE, 1, tx_hash="0x1", block_number=3)
        with pytest.raises(RejectedInput) as info:
            await j.write(j.append, rc(2, n=3))
        assert info.value.reason == "conflicting_commitment"
        assert [(e.round, e.state) for e in j.entries()] == [
            (1, EntryState.LANDED),
            (2, EntryState.PENDING),
        ]
