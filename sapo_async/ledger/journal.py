"""Durable local journal of round commitments (SQLite), written before anything is sent.

Owns the on-disk record of every commitment a node made and where it stands: ``pending``
(not known on chain), ``landed`` (with tx and block) or ``failed`` (the chain can never take
it, with the reason); an index of every rollout hash a commitment names (``sapo-async
verify`` finds a hash's node and round there); and the *credit claims* of landed
commitments, the usage entries the chain kept as claims (``open``, then ``settled``,
``lapsed`` or ``refused``). It does not talk to the chain: :mod:`.recorder` does.

Invariants:
- an entry is durable (``synchronous=FULL``) before :meth:`Journal.append` returns;
- per node, journaled rounds strictly increase; re-appending the same commitment is a
  no-op, a *different* one for a journaled (node, round) is rejected;
- states only move pending -> landed or pending -> failed; a landed entry's claims are
  written in the same transaction; a claim leaves ``open`` once, never back.

Damage: a file that is not SQLite or that SQLite finds malformed (``PRAGMA quick_check`` at
open, and any later read or write) raises :class:`~sapo_async.errors.JournalError` naming
the file and what to do; the journal never deletes, truncates or rewrites a damaged file.

Threads: every method is synchronous (the CLI and the audit use it as is). A write commits
with an fsync (milliseconds to seconds on a busy disk), so async callers write through
:meth:`Journal.write`: one write at a time per journal in a worker thread, in the order
issued. Reads of a file-backed journal use their own connection (under WAL they never wait
for a writer's fsync). Each connection is guarded by its own lock.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import ParamSpec, TypeVar

import anyio

from sapo_async.errors import JournalError, RejectedInput
from sapo_async.ledger.journal_faults import advice, cause_of
from sapo_async.ledger.journal_types import (
    ClaimState,
    CreditClaim,
    EntryState,
    JournalEntry,
    RolloutLocation,
)
from sapo_async.ledger.types import RoundCommitment, checksum

# The value types live in journal_types; re-exported so callers import them from here.
__all__ = ["ClaimState", "CreditClaim", "EntryState", "Journal", "JournalEntry", "RolloutLocation"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS commitments (
    node TEXT NOT NULL,
    round INTEGER NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    tx_hash TEXT,
    block_number INTEGER,
    created_at REAL NOT NULL,
    settled_at REAL,
    PRIMARY KEY (node, round)
);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_hash BLOB NOT NULL,
    node TEXT NOT NULL,
    round INTEGER NOT NULL,
    kind TEXT NOT NULL,
    producer TEXT NOT NULL,
    PRIMARY KEY (rollout_hash, node, round, kind)
);
CREATE INDEX IF NOT EXISTS commitments_state ON commitments (state, node, round);
CREATE TABLE IF NOT EXISTS claims (
    node TEXT NOT NULL,
    round INTEGER NOT NULL,
    producer TEXT NOT NULL,
    producer_round INTEGER NOT NULL,
    count INTEGER NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    created_at REAL NOT NULL,
    settled_at REAL,
    PRIMARY KEY (node, round, producer, producer_round)
);
CREATE INDEX IF NOT EXISTS claims_state ON claims (state, node);
"""


class Journal:
    """The SQLite journal at ``path`` (created with its folder if missing).

    Use as a context manager or call :meth:`close`.

    Raises:
        JournalError: the file is not a SQLite database, is malformed, or cannot be
            opened (the message names it and what to do; the file is left as it was).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        in_memory = str(path) == ":memory:"
        self._db: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        with self._guard("open"):
            if not in_memory:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = threading.Lock()
            self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            # Read before anything is written: a file that is not SQLite fails here.
            (verdict,) = self._db.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                found = " ".join(str(verdict).split())[:200]
                raise sqlite3.DatabaseError(f"database disk image is malformed ({found})")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            # ":memory:" is private to its connection, so reads share the writer's there.
            self._read_lock = self._lock if in_memory else threading.Lock()
            self._reader = (
                self._db
                if in_memory
                else sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            )
        self._writer = anyio.CapacityLimiter(1)

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """Translate sqlite3's errors (and a mangled entry body) into JournalError, with
        its cause and what to do about it."""
        try:
            yield
        except (sqlite3.DatabaseError, OSError, ValueError) as exc:
            if isinstance(exc, RejectedInput):
                raise
            if action == "open":
                for conn in (self._reader, self._db):
                    if conn is not None:
                        conn.close()
            cause = cause_of(exc)
            raise JournalError(
                f"cannot {action} the ledger journal {self.path}: {advice(cause, self.path, exc)}",
                path=str(self.path),
                cause=cause,
            ) from exc

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            self._conn.close()
        if self._reader is not self._db:
            with self._read_lock:
                self._reading.close()

    @property
    def _conn(self) -> sqlite3.Connection:
        assert self._db is not None  # set by __init__, or __init__ raised
        return self._db

    @property
    def _reading(self) -> sqlite3.Connection:
        assert self._reader is not None  # set by __init__, or __init__ raised
        return self._reader

    async def write(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``fn`` (one of this journal's writes, e.g. ``journal.append``) off the event
        loop, in this journal's writer thread, and return its result once it is durable.

        Writes through here run one at a time, in the order they were issued; the calling
        task waits (even when cancelled: a write that started always finishes), other tasks
        keep running.

        Raises:
            Exception: whatever ``fn`` raises, unchanged.
        """

        def call() -> _T:
            return fn(*args, **kwargs)

        return await anyio.to_thread.run_sync(call, limiter=self._writer)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._guard("write"), self._lock:
            db = self._conn
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # ------------------------------------------------------------------ writes

    def append(self, commitment: RoundCommitment) -> bool:
        """Journal ``commitment`` as pending, durably.

        Returns:
            True if it was written, False if this exact commitment was already journaled.

        Raises:
            RejectedInput: another commitment is journaled for this (node, round)
                (``conflicting_commitment``), or the round is not above the node's highest
                journaled round (``round_not_increasing``).
        """
        body = commitment.to_json()
        with self._tx() as db:
            row = db.execute(
                "SELECT body FROM commitments WHERE node = ? AND round = ?",
                (commitment.node, commitment.round),
            ).fetchone()
            if row is not None:
                if row[0] == body:
                    return False
                raise RejectedInput(
                    "conflicting_commitment",
                    f"node {commitment.node} already journaled a different round "
                    f"{commitment.round}",
                    producer=commitment.node,
                )
            (highest,) = db.execute(
                "SELECT MAX(round) FROM commitments WHERE node = ?", (commitment.node,)
            ).fetchone()
            if highest is not None and commitment.round <= highest:
                raise RejectedInput(
                    "round_not_increasing",
                    f"node {commitment.node} round {commitment.round} <= journaled {highest}",
                    producer=commitment.node,
                )
            db.execute(
                "INSERT INTO commitments (node, round, body, state, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (commitment.node, commitment.round, body, EntryState.PENDING, time.time()),
            )
            rows = [
                (h, commitment.node, commitment.round, "own", commitment.node)
                for h in commitment.rollout_hashes
            ]
            rows += [
                (h, commitment.node, commitment.round, "external", producer)
                for producer, _, hashes in commitment.usage()
                for h in hashes
            ]
            db.executemany(
                "INSERT OR IGNORE INTO rollouts (rollout_hash, node, round, kind, producer) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        return True

    def record_attempt(self, node: str, round_: int, error: str) -> None:
        """Count a failed send of a pending entry and keep its error."""
        with self._tx() as db:
            db.execute(
                "UPDATE commitments SET attempts = attempts + 1, last_error = ? "
                "WHERE node = ? AND round = ? AND state = ?",
                (error[:500], checksum(node), round_, EntryState.PENDING),
            )

    def withdraw_usage(
        self, node: str, round_: int, producer_rounds: set[tuple[str, int]]
    ) -> RoundCommitment | None:
        """Take ``producer_rounds`` out of a pending entry's usage; return what is left.

        Only for producer rounds whose own commitment on chain refuses this credit (it
        shared nothing, or fewer rollouts than this node used: a publish acked by the
        server that its producer saw fail); the round then lands without them. Their
        hashes leave the body and the rollout index together.

        Returns:
            the reduced commitment, or None if no such pending entry exists.
        """
        with self._tx() as db:
            row = db.execute(
                "SELECT body FROM commitments WHERE node = ? AND round = ? AND state = ?",
                (checksum(node), round_, EntryState.PENDING),
            ).fetchone()
            if row is None:
                return None
            before = RoundCommitment.from_json(row[0])
            kept: dict[str, dict[int, tuple[bytes, ...]]] = {}
            gone: list[bytes] = []
            for producer, r, hashes in before.usage():
                if (producer, r) in producer_rounds:
                    gone.extend(hashes)
                else:
                    kept.setdefault(producer, {})[r] = hashes
            after = dataclasses.replace(before, external_hashes=kept)
            db.execute(
                "UPDATE commitments SET body = ? WHERE node = ? AND round = ?",
                (after.to_json(), after.node, after.round),
            )
            db.executemany(
                "DELETE FROM rollouts WHERE rollout_hash = ? AND node = ? AND round = ? "
                "AND kind = 'external'",
                [(h, after.node, after.round) for h in gone],
            )
        return after

    def mark_landed(
        self,
        node: str,
        round_: int,
        *,
        tx_hash: str | None,
        block_number: int | None,
        claimed: Collection[tuple[str, int]] | None = None,
    ) -> None:
        """Mark a pending entry landed (no-op if it already is) and, in the same
        transaction, open a credit claim for each usage entry the chain kept as a claim.

        Args:
            claimed: their (producer, producer round), from the ``UsageClaimed`` logs; None
                (no receipt: found already on chain) opens one per usage entry, and the
                recorder's first look at the chain closes those credited at once.
        """
        landed = EntryState.LANDED
        self._settle(
            node, round_, landed, tx_hash=tx_hash, block_number=block_number, claimed=claimed
        )

    def settle_claim(
        self,
        node: str,
        round_: int,
        producer: str,
        producer_round: int,
        *,
        state: ClaimState,
        reason: str | None = None,
    ) -> None:
        """Move an open claim to ``state`` (settled, lapsed or refused; no-op if not open)."""
        with self._tx() as db:
            db.execute(
                "UPDATE claims SET state = ?, reason = ?, settled_at = ? WHERE node = ? AND "
                "round = ? AND producer = ? AND producer_round = ? AND state = ?",
                (
                    state,
                    reason,
                    time.time(),
                    checksum(node),
                    round_,
                    checksum(producer),
                    producer_round,
                    ClaimState.OPEN,
                ),
            )

    def mark_failed(self, node: str, round_: int, reason: str) -> None:
        """Mark a pending entry as one the chain will never take, with ``reason``."""
        self._settle(node, round_, EntryState.FAILED, error=reason)

    def _settle(
        self,
        node: str,
        round_: int,
        state: EntryState,
        *,
        tx_hash: str | None = None,
        block_number: int | None = None,
        error: str | None = None,
        claimed: Collection[tuple[str, int]] | None = None,
    ) -> None:
        with self._tx() as db:
            moved = db.execute(
                "UPDATE commitments SET state = ?, tx_hash = COALESCE(?, tx_hash), "
                "block_number = COALESCE(?, block_number), last_error = COALESCE(?, last_error), "
                "settled_at = ? WHERE node = ? AND round = ? AND state = ?",
                (
                    state,
                    tx_hash,
                    block_number,
                    error,
                    time.time(),
                    checksum(node),
                    round_,
                    EntryState.PENDING,
                ),
            ).rowcount
            if not moved or state is not EntryState.LANDED:
                return
            (body,) = db.execute(
                "SELECT body FROM commitments WHERE node = ? AND round = ?",
                (checksum(node), round_),
            ).fetchone()
            commitment = RoundCommitment.from_json(body)
            kept = {(checksum(p), r) for p, r in claimed or ()}
            now = time.time()
            db.executemany(
                "INSERT OR IGNORE INTO claims (node, round, producer, producer_round, count, "
                "state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (commitment.node, commitment.round, p, r, len(h), ClaimState.OPEN, now)
                    for p, r, h in commitment.usage()
                    if claimed is None or (p, r) in kept
                ],
            )

    # ------------------------------------------------------------------ reads

    def open_claims(self, node: str) -> list[CreditClaim]:
        """``node``'s open claims, oldest round first."""
        with self._guard("read"), self._read_lock:
            rows = self._reading.execute(
                "SELECT node, round, producer, producer_round, count, state, created_at "
                "FROM claims WHERE node = ? AND state = ? ORDER BY round, producer, producer_round",
                (checksum(node), ClaimState.OPEN),
            ).fetchall()
        return [CreditClaim(r[0], r[1], r[2], r[3], r[4], ClaimState(r[5]), r[6]) for r in rows]

    def claim_counts(self, node: str) -> dict[ClaimState, int]:
        """Number of ``node``'s claims per state."""
        with self._guard("read"), self._read_lock:
            rows = self._reading.execute(
                "SELECT state, COUNT(*) FROM claims WHERE node = ? GROUP BY state",
                (checksum(node),),
            ).fetchall()
        found = {ClaimState(state): n for state, n in rows}
        return {state: found.get(state, 0) for state in ClaimState}

    def _entries(self, where: str, args: tuple[object, ...]) -> list[JournalEntry]:
        with self._guard("read"):
            with self._read_lock:
                query = (
                    "SELECT body, state, attempts, last_error, tx_hash, block_number, created_at, "  # noqa: S608 - `where` is one of our fixed clauses
                    f"settled_at FROM commitments WHERE {where} ORDER BY node, round"
                )
                rows = self._reading.execute(query, args).fetchall()
            return [
                JournalEntry(
                    commitment=RoundCommitment.from_json(r[0]),
                    state=EntryState(r[1]),
                    attempts=r[2],
                    last_error=r[3],
                    tx_hash=r[4],
                    block_number=r[5],
                    created_at=r[6],
                    settled_at=r[7],
                )
                for r in rows
            ]

    def pending(self, node: str | None = None) -> list[JournalEntry]:
        """Pending entries (of ``node``, or all), by node then ascending round."""
        if node is None:
            return self._entries("state = ?", (EntryState.PENDING,))
        return self._entries("state = ? AND node = ?", (EntryState.PENDING, checksum(node)))

    def entries(self, node: str | None = None) -> list[JournalEntry]:
        """Every entry (of ``node``, or all), by node then ascending round."""
        if node is None:
            return self._entries("1 = 1", ())
        return self._entries("node = ?", (checksum(node),))

    def entry(self, node: str, round_: int) -> JournalEntry | None:
        """The entry of ``node`` for ``round_``, if journaled."""
        found = self._entries("node = ? AND round = ?", (checksum(node), round_))
        return found[0] if found else None

    def find_rollout(self, rollout_hash: bytes) -> list[RolloutLocation]:
        """Every (node, round) whose commitment names ``rollout_hash``."""
        with self._guard("read"), self._read_lock:
            rows = self._reading.execute(
                "SELECT node, round, kind, producer FROM rollouts WHERE rollout_hash = ? "
                "ORDER BY kind DESC, node, round",
                (bytes(rollout_hash),),
            ).fetchall()
        return [RolloutLocation(bytes(rollout_hash), r[0], r[1], r[2], r[3]) for r in rows]

    def counts(self, node: str | None = None) -> dict[EntryState, int]:
        """Number of entries per state (of ``node``, or all)."""
        where, args = ("node = ?", (checksum(node),)) if node else ("1 = 1", ())
        with self._guard("read"), self._read_lock:
            rows = self._reading.execute(
                f"SELECT state, COUNT(*) FROM commitments WHERE {where} GROUP BY state",  # noqa: S608 - fixed clauses only
                args,
            ).fetchall()
        found = {EntryState(state): n for state, n in rows}
        return {state: found.get(state, 0) for state in EntryState}
