"""The SQLite journal: durability, idempotency, ordering, rollout index (no chain)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import anyio
import pytest

from sapo_async.errors import JournalError, RejectedInput
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


def _damage(good: bytes, how: str) -> bytes:
    if how == "random bytes":
        return bytes(random.Random(7).randbytes(len(good)))
    if how == "truncated":
        return good[: len(good) // 3]
    if how == "a zeroed page":
        return good[:4096] + b"\0" * 4096 + good[8192:]
    flipped = bytearray(good)  # "flipped bytes": one in every 97 past the header page
    for i in range(4096, len(flipped), 97):
        flipped[i] ^= 0xFF
    return bytes(flipped)


@pytest.mark.parametrize("how", ["random bytes", "truncated", "a zeroed page", "flipped bytes"])
def test_a_damaged_journal_is_named_with_what_to_do_and_left_as_it_was(
    tmp_path: Path, how: str
) -> None:
    # These surfaced sqlite3.DatabaseError ("file is not a database", "malformed") as a
    # traceback, at open or later, mid-run.
    good = tmp_path / "good.sqlite"
    with Journal(good) as j:
        for r in range(40):
            j.append(rc(r, n=20))
    path = tmp_path / "journal.sqlite"
    path.write_bytes(_damage(good.read_bytes(), how))
    before = path.read_bytes()
    with pytest.raises(JournalError) as caught:
        Journal(path)  # quick_check at open: found before the node runs a round
    message = str(caught.value)
    assert str(path) in message
    assert "restore it from a backup, or move it aside" in message
    assert "\n" not in message
    assert caught.value.path == str(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.sqlite", "journal.sqlite"]


def test_a_journal_path_that_cannot_be_opened_is_a_journal_error(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="cannot open the ledger journal"):
        Journal(tmp_path)  # a directory


def test_verify_names_a_damaged_journal_in_one_line_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from sapo_async.cli.main import build_app

    # A ./node.toml without contract_address: --ledger completes it rather than failing.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node.toml").write_text('[ledger]\nrpc_url = "http://127.0.0.1:9"\n')
    for name in ("SAPO_JOURNAL", "SAPO_LEDGER_RPC", "SAPO_LEDGER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "journal.sqlite"
    path.write_bytes(random.Random(3).randbytes(8192))
    out = CliRunner().invoke(
        build_app(),
        ["verify", "0x" + "ab" * 32, "--journal", str(path), "--ledger", "0x" + "1" * 40],
    )
    assert out.exit_code == 2, out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)
    assert "cannot open the ledger journal" in out.output
    assert str(path) in out.output
