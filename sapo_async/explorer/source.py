"""Where the explorer's numbers come from: the ledger, the round logs and the journals.

Owns :class:`Explorer`, which answers the three questions the pages ask (the swarm, one
node, one rollout hash) by reading the ledger (its event index when given, else the audit
views of :mod:`sapo_async.ledger.audit`), the nodes' JSONL logs and the journals: they
index which (node, round) committed a hash, for inclusion checks, and hold what each node
has not landed yet (its backlog, which the chain cannot show). The swarm snapshot is cached
for :data:`~sapo_async.limits.EXPLORER_REFRESH_S` so that any number of open pages cost
the chain one read per interval.

Deliberately knows no HTTP: errors are the package's own (:class:`RejectedInput` for a
visitor's bad value or an unknown node, :class:`LedgerError` for the chain), and
:mod:`.app` maps them to status codes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from sapo_async import limits
from sapo_async.errors import JournalError, RejectedInput
from sapo_async.explorer.views import (
    LiveBacklog,
    NodeLog,
    node_view,
    parse_proof,
    parse_rollout_hash,
    read_logs,
    swarm_view,
    verification_view,
)
from sapo_async.ledger.audit import (
    NodeAudit,
    RolloutVerification,
    audit_node,
    audit_swarm,
    verify_rollout,
)
from sapo_async.ledger.base import Ledger
from sapo_async.ledger.index import LedgerIndex
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.journal_types import EntryState
from sapo_async.ledger.score import contribution_scores
from sapo_async.ledger.types import UsageCredit, checksum

__all__ = ["Explorer", "journal_paths"]

KINDS = ("own", "external")


def journal_paths(places: Sequence[Path]) -> list[Path]:
    """The journal files in ``places``: each a journal file or a folder of ``*.sqlite``."""
    found: list[Path] = []
    for place in places:
        if place.is_dir():
            found.extend(sorted(place.glob("*.sqlite")))
        elif place.is_file():
            found.append(place)
    return found


def _pending_by_node(files: Sequence[Path], nodes: Sequence[str]) -> dict[str, int]:
    """Pending commitments of each of ``nodes`` found in the journal files (summed across
    them); a node no journal holds is left out, and a journal that cannot be opened is
    skipped: those nodes' backlog is then unknown."""
    pending: dict[str, int] = {}
    for path in files:
        try:
            with Journal(path) as journal:
                for node in nodes:
                    counts = journal.counts(node)
                    if any(counts.values()):
                        pending[node] = pending.get(node, 0) + counts[EntryState.PENDING]
        except JournalError:
            continue
    return pending


def _logs_signature(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every log: what changes when a node appends a round."""
    found = []
    for path in sorted(directory.glob("*.jsonl")):
        try:
            st = path.stat()
        except OSError:
            continue
        found.append((path.name, st.st_size, st.st_mtime_ns))
    return tuple(found)


class Explorer:
    """Reads one swarm for the pages.

    Args:
        ledger: the swarm's ledger (any backend of the port).
        chain: where the chain is, as shown on the page (``embedded`` or the RPC URL).
        logs: a folder of JSONL round logs, or None.
        journals: journal files or folders of them, for inclusion checks; a callable is
            asked each time (the embedded swarm's journals appear as nodes join).
        refresh_s: how long a swarm snapshot is reused.
        index: an incremental event index of the ledger (:class:`LedgerIndex`): the swarm
            page then costs a few RPC calls per refresh whatever the number of nodes,
            instead of three view calls per node and an event scan from the deployment;
            the node page reads it too (no view call per visit).
        live: asked for the backlogs of nodes running in this process (the demo swarm),
            exact where the journals and logs give a count only.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        chain: str,
        logs: Path | None = None,
        journals: Sequence[Path] | Callable[[], Sequence[Path]] = (),
        refresh_s: float = limits.EXPLORER_REFRESH_S,
        index: LedgerIndex | None = None,
        live: Callable[[], Mapping[str, LiveBacklog]] | None = None,
    ) -> None:
        self.ledger = ledger
        self._live = live
        self._index = index
        self.chain = chain
        self.logs = logs
        self._journals = journals
        self._refresh_s = refresh_s
        self._lock = anyio.Lock()
        self._snapshot: dict[str, Any] | None = None
        self._snapshot_text = ""
        self._read_at = float("-inf")
        self._index_at = float("-inf")
        self._logs_key: tuple[tuple[str, int, int], ...] | None = None
        self._logs_cache: dict[str, NodeLog] = {}
        self.revision = 0
        """Grows by one each time the swarm snapshot changes (the live stream's clock)."""

    def journal_files(self) -> list[Path]:
        """The journal files the inclusion checks look in, now."""
        places = self._journals() if callable(self._journals) else self._journals
        return journal_paths(list(places))

    async def _journal_pending(self, nodes: Sequence[str]) -> dict[str, int]:
        """The pending commitments of each of ``nodes`` the journals hold (read in a worker
        thread)."""
        files = self.journal_files()
        if not files:
            return {}
        return await anyio.to_thread.run_sync(_pending_by_node, files, nodes)

    def _live_backlogs(self) -> Mapping[str, LiveBacklog]:
        return self._live() if self._live is not None else {}

    async def _logs(self) -> dict[str, NodeLog]:
        """The round logs, re-read (in a worker thread) only when a file changed: a long
        run's logs are megabytes, and the snapshot is taken every second."""
        if self.logs is None:
            return {}
        directory = self.logs
        key = await anyio.to_thread.run_sync(_logs_signature, directory)
        if key != self._logs_key:
            self._logs_cache = await anyio.to_thread.run_sync(read_logs, directory)
            self._logs_key = key
        return self._logs_cache

    async def swarm(self) -> dict[str, Any]:
        """``/api/swarm``, at most :attr:`refresh_s` old.

        Raises:
            LedgerError: the chain cannot be read.
        """
        async with self._lock:
            if self._snapshot is None or time.monotonic() - self._read_at >= self._refresh_s:
                snapshot = await self._read_swarm()
                text = json.dumps(snapshot, sort_keys=True)
                if text != self._snapshot_text:
                    self.revision += 1
                    self._snapshot_text = text
                self._snapshot = snapshot
                self._read_at = time.monotonic()
            return {**self._snapshot, "revision": self.revision}

    async def _read_swarm(self) -> dict[str, Any]:
        if self._index is not None:
            await self._refresh_index()
            seen: dict[str, int | None] = dict(self._index.last_seen())
            return await self._view(self._index.audits(), self._index.credits(), seen)
        # Totals from the views (one call each); the usage graph from one event scan for
        # the whole swarm rather than two per node (audit_swarm's breakdown).
        audits = await audit_swarm(self.ledger, breakdown=False)
        credits = await self.ledger.usage_credits()
        last_seen: dict[str, int | None] = {}
        for a in audits:
            stored = (
                None
                if a.last_round is None
                else await self.ledger.commitment_of(a.node, a.last_round)
            )
            last_seen[a.node] = stored.timestamp if stored else None
        return await self._view(audits, credits, last_seen)

    async def _refresh_index(self) -> None:
        """Bring the index up to the chain's head, at most once per :attr:`refresh_s`
        (the swarm snapshot and the node pages share it)."""
        if self._index is not None and time.monotonic() - self._index_at >= self._refresh_s:
            await self._index.refresh()
            self._index_at = time.monotonic()

    async def _view(
        self, audits: list[NodeAudit], credits: list[UsageCredit], last_seen: dict[str, int | None]
    ) -> dict[str, Any]:
        # The contribution score from the same events (pure), not ledger_scores' re-read.
        scores = contribution_scores(
            credits, {a.node: a.participation.rounds_committed for a in audits}
        )
        audits = [replace(a, score=scores.get(a.node)) for a in audits]
        return swarm_view(
            ledger=self.ledger.address,
            chain=self.chain,
            audits=audits,
            credits=credits,
            last_seen=last_seen,
            logs=await self._logs(),
            journal_pending=await self._journal_pending([a.node for a in audits]),
            live=self._live_backlogs(),
        )

    async def node(self, address: str) -> dict[str, Any]:
        """``/api/node/{address}``.

        Raises:
            RejectedInput: ``bad_address`` (not an address) or ``unknown_node`` (the
                ledger never saw it and no log names it).
            LedgerError: the chain cannot be read.
        """
        node = checksum(address)
        audit: NodeAudit | None = None
        if self._index is not None:
            async with self._lock:
                await self._refresh_index()
            audit = self._index.audit(node)
        if audit is not None and self._index is not None:
            commitments = self._index.commitments(node)
        else:  # no index, or a node it never saw register: the contract's views
            audit = await audit_node(self.ledger, node)
            commitments = None
        log = (await self._logs()).get(node)
        if not audit.registered and audit.participation.rounds_committed == 0 and log is None:
            raise RejectedInput(
                "unknown_node", f"{node} is not a node of the ledger at {self.ledger.address}"
            )
        if commitments is None:
            commitments = await self.ledger.commitments(node)
        return node_view(
            audit,
            commitments,
            log,
            journal_pending=(await self._journal_pending([node])).get(node),
            live=self._live_backlogs().get(node),
        )

    async def verify(
        self,
        rollout_hash: str,
        *,
        node: str | None = None,
        round_: str | None = None,
        kind: str | None = None,
        proof: str | None = None,
    ) -> dict[str, Any]:
        """``/api/verify/{hash}``: ask the contract whether the hash was committed.

        With ``node`` (and ``round_``, ``kind``, ``proof``) the visitor's own proof is
        checked; without, the journals are searched for every (node, round) naming the
        hash and the proof is rebuilt from the round's hash list.

        Raises:
            RejectedInput: a malformed hash, address, round, kind or proof.
            LedgerError: the chain cannot be read.
        """
        digest = parse_rollout_hash(rollout_hash)
        if node:
            return verification_view(
                digest, [await self._check_proof(digest, node, round_, kind, proof)], searched=0
            )
        files = self.journal_files()
        journals = [Journal(p) for p in files]
        try:
            found = await verify_rollout(self.ledger, journals, digest)
        finally:
            for j in journals:
                j.close()
        return verification_view(digest, found, searched=len(files))

    async def _check_proof(
        self, digest: bytes, node: str, round_: str | None, kind: str | None, proof: str | None
    ) -> RolloutVerification:
        address = checksum(node)
        try:
            number = int(round_ or "")
        except ValueError:
            number = -1
        if not 0 <= number < 2**64:
            raise RejectedInput("bad_round", f"round {round_!r:.40} is not a round number")
        kind = kind or "own"
        if kind not in KINDS:
            raise RejectedInput("bad_kind", f"kind {kind!r:.40} must be own or external")
        siblings = parse_proof(proof or "")
        check = (
            self.ledger.is_rollout_included if kind == "own" else self.ledger.is_external_included
        )
        included = await check(address, number, digest, siblings)
        producer = address if kind == "own" else ""
        return RolloutVerification(digest, address, number, kind, producer, included, siblings)
