"""An incremental index of the ledger's events, for reading the swarm at scale.

Owns a SQLite copy of every ``NodeRegistered``, ``CommitmentRecorded`` and ``UsageCredited``
event of one ``SapoLedger``, scanned from the last block it saw (``eth_getLogs`` over the
new blocks only), and the swarm's audit numbers derived from it. A refresh costs a handful
of RPC calls whatever the number of nodes: the block number, the hash of the last block
indexed, one ``eth_getLogs`` per ``LEDGER_LOG_CHUNK`` new blocks and one block read per new
block holding commitments (their timestamps). Reading the views instead costs three calls
per node per refresh (:func:`sapo_async.ledger.audit.audit_swarm` and the last commitment).

Invariants:
- the index holds exactly the events of blocks ``from_block .. last`` of the chain whose
  block ``last`` has hash ``last_hash``: a refresh that finds another hash there (a reorg,
  or a dev chain restarted) drops everything and scans again from ``from_block``;
- a file-backed index survives restarts: it resumes from its last block;
- the numbers equal the contract's views once every event is indexed (credit counts only
  credited usage: a claim counts when it is settled, as ``creditReceived`` does).

Deliberately does not know pages or HTTP (:mod:`sapo_async.explorer`), and reads only
through the web3 contract of an :class:`~sapo_async.ledger.evm.EvmLedger`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from web3 import Web3

from sapo_async import limits
from sapo_async.ledger.audit import NodeAudit, Participation
from sapo_async.ledger.evm import EvmLedger
from sapo_async.ledger.score import ContributionScore, contribution_scores
from sapo_async.ledger.types import OnChainCommitment, UsageCredit, checksum

__all__ = ["LedgerIndex"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY, block INTEGER NOT NULL, log INTEGER NOT NULL, metadata TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS commitments (
    node TEXT NOT NULL, round INTEGER NOT NULL, rollouts INTEGER NOT NULL,
    external INTEGER NOT NULL, block INTEGER NOT NULL, timestamp INTEGER NOT NULL,
    policy_version INTEGER NOT NULL, rollout_root BLOB NOT NULL, external_root BLOB NOT NULL,
    PRIMARY KEY (node, round)
);
CREATE TABLE IF NOT EXISTS credits (
    producer TEXT NOT NULL, consumer TEXT NOT NULL, round INTEGER NOT NULL,
    producer_round INTEGER NOT NULL, count INTEGER NOT NULL, block INTEGER NOT NULL,
    log INTEGER NOT NULL, PRIMARY KEY (block, log)
);
"""

_SCHEMA_VERSION = 2
"""Bumped when a table changes shape: an index file of another version is rebuilt (the
chain holds everything it held; version 2 keeps each commitment whole, for the node page)."""

_EVENTS = ("NodeRegistered", "CommitmentRecorded", "UsageCredited")


class LedgerIndex:
    """The events of ``ledger``'s contract, indexed incrementally (see the module docstring).

    Args:
        ledger: the contract to index (its ``from_block`` is where a scan starts).
        path: the SQLite file (created); ``":memory:"`` keeps it in this process only.
    """

    def __init__(self, ledger: EvmLedger, path: str | Path = ":memory:") -> None:
        self._ledger = ledger
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        if self._db.execute("PRAGMA user_version").fetchone()[0] != _SCHEMA_VERSION:
            for table in ("meta", "nodes", "commitments", "credits"):
                self._db.execute(f"DROP TABLE IF EXISTS {table}")
            self._db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        contract = ledger._contract
        self._events: dict[bytes, Any] = {
            bytes(Web3.keccak(text=_signature(contract, name))): getattr(contract.events, name)()
            for name in _EVENTS
        }
        self.rpc_calls = 0
        """RPC requests the refreshes made (for measurements)."""

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            self._db.close()

    async def refresh(self) -> int:
        """Index the blocks mined since the last refresh; returns the events added.

        Raises:
            LedgerUnavailable: the chain cannot be reached.
        """
        return await self._ledger.chain.run(self._refresh_sync)

    def _refresh_sync(self) -> int:
        w3 = self._ledger.chain.w3
        head = int(w3.eth.block_number)
        self.rpc_calls += 1
        last, last_hash = self._meta("last_block"), self._meta("last_hash")
        if last is not None and int(last) <= head:
            self.rpc_calls += 1
            if bytes(w3.eth.get_block(int(last))["hash"]).hex() != last_hash:
                last = None  # a reorg (or a restarted dev chain) under the last block
        elif last is not None:
            last = None  # the chain is shorter than what was indexed: another chain
        if last is None:
            self._reset()
        start = self._ledger.from_block if last is None else int(last) + 1
        added = 0
        rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in _EVENTS}
        stamps: dict[int, int] = {}
        for lo in range(start, head + 1, limits.LEDGER_LOG_CHUNK):
            hi = min(head, lo + limits.LEDGER_LOG_CHUNK - 1)
            logs = w3.eth.get_logs(
                {
                    "address": Web3.to_checksum_address(self._ledger.address),
                    "fromBlock": lo,
                    "toBlock": hi,
                }
            )
            self.rpc_calls += 1
            for log in logs:
                event = self._events.get(bytes(log["topics"][0]))
                if event is None:
                    continue  # UsageClaimed: credit counts once settled
                decoded = event.process_log(log)
                name, a = decoded["event"], decoded["args"]
                block, index = int(log["blockNumber"]), int(log["logIndex"])
                if name == "NodeRegistered":
                    rows[name].append((checksum(a["node"]), block, index, a["metadata"]))
                elif name == "CommitmentRecorded":
                    if block not in stamps:
                        stamps[block] = int(w3.eth.get_block(block)["timestamp"])
                        self.rpc_calls += 1
                    rows[name].append(
                        (checksum(a["node"]), int(a["round"]), int(a["rolloutCount"]),
                         int(a["externalCount"]), block, stamps[block], int(a["policyVersion"]),
                         bytes(a["rolloutRoot"]), bytes(a["externalRoot"]))
                    )  # fmt: skip
                else:
                    rows[name].append(
                        (checksum(a["producer"]), checksum(a["consumer"]), int(a["round"]),
                         int(a["producerRound"]), int(a["count"]), block, index)
                    )  # fmt: skip
                added += 1
        head_hash = bytes(w3.eth.get_block(head)["hash"]).hex()
        self.rpc_calls += 1
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?)", rows[_EVENTS[0]])
            db.executemany(
                "INSERT OR REPLACE INTO commitments VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows[_EVENTS[1]],
            )
            db.executemany(
                "INSERT OR REPLACE INTO credits VALUES (?, ?, ?, ?, ?, ?, ?)", rows[_EVENTS[2]]
            )
            db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [("last_block", str(head)), ("last_hash", head_hash)],
            )
            db.execute("COMMIT")
        return added

    def _meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _reset(self) -> None:
        with self._lock:
            for table in ("meta", "nodes", "commitments", "credits"):
                self._db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names

    # ------------------------------------------------------------------ reads

    @property
    def last_block(self) -> int | None:
        """The last block indexed (None: nothing yet)."""
        last = self._meta("last_block")
        return None if last is None else int(last)

    def audits(
        self, *, breakdown: bool = False, trusted: Iterable[str] | None = None
    ) -> list[NodeAudit]:
        """Every registered node's numbers, in registration order.

        Args:
            breakdown: also each node's usage by consumer and by producer and its
                contribution score (as :func:`~sapo_async.ledger.audit.audit_swarm`).
            trusted: consumers whose credit weighs fully in the score (None: all).

        Raises:
            RejectedInput: a ``trusted`` entry is not an address.
        """
        with self._lock:
            nodes = self._db.execute(
                "SELECT node, metadata FROM nodes ORDER BY block, log"
            ).fetchall()
            totals = {
                r[0]: r[1:]
                for r in self._db.execute(
                    "SELECT node, COUNT(*), MAX(round), SUM(rollouts), SUM(external) "
                    "FROM commitments GROUP BY node"
                )
            }
            credit = dict(
                self._db.execute("SELECT producer, SUM(count) FROM credits GROUP BY producer")
            )
        out = []
        for node, metadata in nodes:
            rounds, last, rollouts, external = totals.get(node, (0, None, 0, 0))
            out.append(
                NodeAudit(
                    node=node,
                    registered=True,
                    metadata=metadata,
                    last_round=last,
                    participation=Participation(
                        rounds_committed=rounds,
                        rollouts_committed=rollouts,
                        external_used=external,
                        credit_received=credit.get(node, 0),
                    ),
                )
            )
        if not breakdown:
            return out
        by_consumer: dict[str, Counter[str]] = {}
        by_producer: dict[str, Counter[str]] = {}
        for u in self.credits():
            by_consumer.setdefault(u.producer, Counter())[u.consumer] += u.count
            by_producer.setdefault(u.consumer, Counter())[u.producer] += u.count
        scores = self.scores(trusted)
        return [
            replace(
                a,
                credit_by_consumer=dict(by_consumer.get(a.node, {})),
                usage_by_producer=dict(by_producer.get(a.node, {})),
                score=scores.get(a.node),
            )
            for a in out
        ]

    def audit(self, node: str, *, trusted: Iterable[str] | None = None) -> NodeAudit | None:
        """One node's numbers with its usage breakdown and contribution score, as
        :func:`~sapo_async.ledger.audit.audit_node` reads them from the views and events;
        None when the index never saw the node register (the caller asks the views).

        Raises:
            RejectedInput: ``node`` or a ``trusted`` entry is not an address.
        """
        address = checksum(node)
        return next(
            (a for a in self.audits(breakdown=True, trusted=trusted) if a.node == address), None
        )

    def scores(self, trusted: Iterable[str] | None = None) -> dict[str, ContributionScore]:
        """Every node's contribution score, as :func:`~sapo_async.ledger.audit.ledger_scores`
        computes it from the same events and rounds."""
        with self._lock:
            rounds = dict(self._db.execute("SELECT node, COUNT(*) FROM commitments GROUP BY node"))
            registered = [r[0] for r in self._db.execute("SELECT node FROM nodes")]
        credits = self.credits()
        nodes = set(registered) | {u.consumer for u in credits}
        return contribution_scores(
            credits,
            {n: rounds.get(n, 0) for n in sorted(nodes)},
            None if trusted is None else list(trusted),
        )

    def commitments(self, node: str) -> list[OnChainCommitment]:
        """``node``'s commitments indexed, oldest first (as ``Ledger.commitments``)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT node, round, policy_version, rollout_root, rollouts, external_root, "
                "external, block, timestamp FROM commitments WHERE node = ? ORDER BY block, round",
                (checksum(node),),
            ).fetchall()
        return [
            OnChainCommitment(r[0], r[1], r[2], bytes(r[3]), r[4], bytes(r[5]), *r[6:])
            for r in rows
        ]

    def credits(self) -> list[UsageCredit]:
        """Every ``UsageCredited`` event indexed, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT producer, consumer, round, count, block, producer_round FROM credits "
                "ORDER BY block, log"
            ).fetchall()
        return [UsageCredit(*row) for row in rows]

    def last_seen(self) -> dict[str, int]:
        """The timestamp of each node's latest commitment."""
        with self._lock:
            rows = self._db.execute(
                "SELECT node, timestamp FROM commitments c WHERE round = "
                "(SELECT MAX(round) FROM commitments WHERE node = c.node)"
            ).fetchall()
        return dict(rows)

    def usage_totals(self) -> Counter[str]:
        """External rollouts credited by each consumer (a cross-check of ``external_used``)."""
        with self._lock:
            return Counter(
                dict(self._db.execute("SELECT consumer, SUM(count) FROM credits GROUP BY consumer"))
            )


def _signature(contract: Any, name: str) -> str:
    abi = next(
        item for item in contract.abi if item.get("type") == "event" and item["name"] == name
    )
    return f"{name}({','.join(i['type'] for i in abi['inputs'])})"
