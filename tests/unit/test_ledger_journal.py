"""The SQLite journal: durability, idempotency, ordering, rollout index (no chain)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sapo_async.errors import RejectedInput
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ledger.types import RoundCommitment

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
        c = RoundCommitment(NODE, 1, 1, [shared], {OTHER: [os.urandom(32)]})
        j.append(c)
        j.append(RoundCommitment(OTHER, 4, 1, [], {NODE: [shared]}))
        found = j.find_rollout(shared)
        assert [(f.node.lower(), f.round, f.kind) for f in found] == [
            (NODE.lower(), 1, "own"),
            (OTHER, 4, "external"),
        ]
        assert j.find_rollout(os.urandom(32)) == []
