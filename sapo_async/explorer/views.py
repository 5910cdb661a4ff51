"""What the explorer's pages show, as JSON-ready dicts built from plain data (pure).

Owns the shapes of ``/api/swarm``, ``/api/node/{address}`` and ``/api/verify/{hash}``, the
parsing of a visitor's input (addresses, rollout hashes, proofs) and the reading of the
nodes' JSONL round logs (one :class:`~sapo_async.node.report.RoundReport` dict a line, as
``sapo-async swarm`` writes them). Deliberately knows neither the chain nor the web
framework: :mod:`.source` gathers the inputs, :mod:`.app` serves the outputs.

Invariants: every number that comes from the chain is copied unchanged from the audit
(:class:`~sapo_async.ledger.audit.NodeAudit`) or the contract's events, so the page shows
the contract's views; numbers from logs are marked as such (``log``) and never mixed in.
A node's commitment backlog (journaled, not yet on chain) is not on the chain at all: it
is shown with where it was read (the running node, its journal, or its log's last round)
and as unknown (None) where none of them is at hand, never guessed from the chain.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_async.errors import RejectedInput
from sapo_async.ledger.audit import NodeAudit, RolloutVerification
from sapo_async.ledger.types import OnChainCommitment, UsageCredit

__all__ = [
    "LiveBacklog",
    "NodeLog",
    "backlog_view",
    "node_view",
    "parse_proof",
    "parse_rollout_hash",
    "read_logs",
    "score_detail",
    "score_of",
    "swarm_view",
    "verification_view",
]


def parse_rollout_hash(text: str) -> bytes:
    """A rollout hash from a visitor: 32 bytes of hex, ``0x`` optional.

    Raises:
        RejectedInput: ``bad_rollout_hash`` naming the value and what is allowed.
    """
    digits = text.strip().removeprefix("0x").removeprefix("0X")
    try:
        digest = bytes.fromhex(digits)
    except ValueError:
        digest = b""
    if len(digest) != 32 or len(digits) != 64:
        raise RejectedInput(
            "bad_rollout_hash", f"{text!r:.80} is not a rollout hash (0x and 64 hex digits)"
        )
    return digest


def parse_proof(text: str) -> list[bytes]:
    """A Merkle proof from a visitor: 32-byte hex siblings separated by commas or spaces
    (empty: the proof of a one-leaf tree).

    Raises:
        RejectedInput: ``bad_proof`` naming the first sibling that is not 32 bytes of hex.
    """
    proof: list[bytes] = []
    for part in text.replace(",", " ").split():
        try:
            proof.append(parse_rollout_hash(part))
        except RejectedInput as exc:
            raise RejectedInput(
                "bad_proof", f"sibling {part!r:.80} is not 32 bytes of hex (0x and 64 digits)"
            ) from exc
    return proof


def score_of(audit: NodeAudit) -> float | None:
    """The audit's contribution score (:mod:`sapo_async.ledger.score`), or None where the
    audit carries none (a totals-only audit, or a ledger audit without scores)."""
    score = getattr(audit, "score", None)
    value = getattr(score, "score", score)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def score_detail(audit: NodeAudit) -> dict[str, Any] | None:
    """What the score is made of (trusted part, standing as a consumer, consumers), if any."""
    score = getattr(audit, "score", None)
    if score is None or score_of(audit) is None:
        return None
    return {
        name: getattr(score, name)
        for name in ("from_trusted", "standing", "consumers")
        if hasattr(score, name)
    }


@dataclass
class NodeLog:
    """What one node's JSONL round log says (numbers the node measured, not the chain).

    Attributes:
        rounds: one entry per line: round, reward, groups shared/received, external
            groups used, rejections that round.
        rejections: rejections by reason over all rounds.
        last_modified: the file's modification time (seconds since the epoch).
    """

    node: str
    name: str
    path: str
    rounds: list[dict[str, Any]] = field(default_factory=list)
    rejections: Counter[str] = field(default_factory=Counter)
    last_modified: float = 0.0


def _round_entry(report: Mapping[str, Any]) -> dict[str, Any]:
    used = report.get("external_used") or {}
    bound = report.get("max_pending")
    return {
        "commitments_pending": int(report.get("commitments_pending", 0)),
        "backlog_wait_s": float(report.get("backlog_wait_s", 0.0)),
        "max_pending": None if bound is None else int(bound),
        "round": int(report["round"]),
        "reward_mean": float(report["reward_mean"]),
        "groups_shared": int(report.get("groups_shared", 0)),
        "groups_received": int(report.get("groups_received", 0)),
        "external_used": int(sum(used.values())),
        "rejected": int(sum((report.get("rejections") or {}).values())),
    }


def read_logs(directory: Path) -> dict[str, NodeLog]:
    """Read every ``*.jsonl`` round log in ``directory``, by node address.

    A line that is not a round report (a partial last line of a log being written, an
    unrelated file) is skipped: the logs are a view, the chain is the record.
    """
    logs: dict[str, NodeLog] = {}
    if not directory.is_dir():
        return logs
    for path in sorted(directory.glob("*.jsonl")):
        try:
            text = path.read_text()
            mtime = path.stat().st_mtime
        except OSError:
            continue
        log: NodeLog | None = None
        for line in text.splitlines():
            try:
                report = json.loads(line)
                entry = _round_entry(report)
                node = str(report["node"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if log is None:
                log = logs.setdefault(node, NodeLog(node, str(report.get("name", "")), str(path)))
            log.rounds.append(entry)
            log.rejections.update(
                {str(k): int(v) for k, v in (report.get("rejections") or {}).items()}
            )
        if log is not None:
            log.last_modified = max(log.last_modified, mtime)
    return logs


@dataclass(frozen=True, slots=True)
class LiveBacklog:
    """A running node's backlog, read from the node itself (the demo swarm's nodes).

    Attributes:
        pending: commitments journaled and not yet on chain.
        paused: whether its rounds are paused now until some land.
        max_pending: its bound (``ledger.max_pending``).
    """

    pending: int
    paused: bool
    max_pending: int


def backlog_view(
    *, live: LiveBacklog | None, journal_pending: int | None, log: NodeLog | None
) -> dict[str, Any]:
    """A node's commitment backlog from the best source at hand.

    The running node answers exactly. Otherwise the journal gives the pending count now
    and the log's last round the bound, so ``paused`` is the node's own rule (rounds wait
    while more than ``max_pending`` are pending); without a journal the log's last round
    gives the count as of that round. Whatever no source gives is None (unknown).

    Returns:
        ``pending``, ``paused``, ``max_pending``, ``last_wait_s`` (seconds the last logged
        round waited for the backlog), ``source`` (``node``, ``journal``, ``log`` or None)
        and ``as_of_round`` (the logged round the figures are from, for ``log``).
    """
    last = log.rounds[-1] if log and log.rounds else None
    out: dict[str, Any] = {
        "pending": None,
        "paused": None,
        "max_pending": last.get("max_pending") if last else None,
        "last_wait_s": last["backlog_wait_s"] if last else None,
        "source": None,
        "as_of_round": None,
    }
    if live is not None:
        out |= {
            "pending": live.pending,
            "paused": live.paused,
            "max_pending": live.max_pending,
            "source": "node",
        }
    elif journal_pending is not None:
        out |= {"pending": journal_pending, "source": "journal"}
    elif last is not None:
        out |= {
            "pending": last["commitments_pending"],
            "source": "log",
            "as_of_round": last["round"],
        }
    if out["paused"] is None and None not in (out["pending"], out["max_pending"]):
        out["paused"] = out["pending"] > out["max_pending"]
    return out


def _node_row(
    audit: NodeAudit, last_seen: int | None, log: NodeLog | None, backlog: dict[str, Any]
) -> dict[str, Any]:
    p = audit.participation
    return {
        "node": audit.node,
        "name": log.name if log else "",
        "metadata": audit.metadata,
        "registered": audit.registered,
        "rounds_committed": p.rounds_committed,
        "last_round": audit.last_round,
        "rollouts_committed": p.rollouts_committed,
        "external_used": p.external_used,
        "credit_received": p.credit_received,
        "score": score_of(audit),
        "last_seen": last_seen,
        "backlog": backlog,
    }


def swarm_view(
    *,
    ledger: str,
    chain: str,
    audits: Sequence[NodeAudit],
    credits: Iterable[UsageCredit],
    last_seen: Mapping[str, int | None],
    logs: Mapping[str, NodeLog],
    journal_pending: Mapping[str, int] | None = None,
    live: Mapping[str, LiveBacklog] | None = None,
) -> dict[str, Any]:
    """``/api/swarm``: every node's on-chain totals, its backlog and the usage graph.

    Args:
        ledger: the contract's address.
        chain: where the chain is (``embedded`` or the RPC URL).
        audits: totals of every registered node (the contract's views).
        credits: the ``UsageCredited`` events (edges: consumer trained on producer).
        last_seen: block timestamp of each node's last commitment.
        logs: round logs by address (names, when given).
        journal_pending: pending commitments by node, from the journals read.
        live: backlogs of nodes running in this process, by address.
    """
    journal_pending = journal_pending or {}
    live = live or {}
    edges: Counter[tuple[str, str]] = Counter()
    for c in credits:
        edges[(c.producer, c.consumer)] += c.count
    nodes = [
        _node_row(
            a,
            last_seen.get(a.node),
            logs.get(a.node),
            backlog_view(
                live=live.get(a.node),
                journal_pending=journal_pending.get(a.node),
                log=logs.get(a.node),
            ),
        )
        for a in audits
    ]
    return {
        "ledger": ledger,
        "chain": chain,
        "nodes": nodes,
        "totals": {
            "nodes": len(nodes),
            "rounds_committed": sum(n["rounds_committed"] for n in nodes),
            "rollouts_committed": sum(n["rollouts_committed"] for n in nodes),
            "external_used": sum(n["external_used"] for n in nodes),
            "paused_for_backlog": sum(n["backlog"]["paused"] is True for n in nodes),
        },
        "usage": [
            {"producer": p, "consumer": c, "count": n} for (p, c), n in sorted(edges.items())
        ],
        "has_score": any(n["score"] is not None for n in nodes),
    }


def node_view(
    audit: NodeAudit,
    commitments: Sequence[OnChainCommitment],
    log: NodeLog | None,
    *,
    journal_pending: int | None = None,
    live: LiveBacklog | None = None,
) -> dict[str, Any]:
    """``/api/node/{address}``: one node's totals, backlog, commitment timeline, usage and
    log (``journal_pending`` and ``live`` as in :func:`swarm_view`).

    The per-round counts join the chain's commitment (rollouts, external) with the log's
    round (reward, received, rejected) by round number; either side may be missing.
    """
    last_seen = commitments[-1].timestamp if commitments else None
    by_round: dict[int, dict[str, Any]] = {}
    for c in commitments:
        by_round[c.round] = {
            "round": c.round,
            "rollouts": c.rollout_count,
            "external": c.external_count,
            "policy_version": c.policy_version,
            "block": c.block_number,
            "timestamp": c.timestamp,
        }
    for entry in log.rounds if log else []:
        by_round.setdefault(entry["round"], {"round": entry["round"]})["log"] = entry
    return {
        **_node_row(
            audit,
            last_seen,
            log,
            backlog_view(live=live, journal_pending=journal_pending, log=log),
        ),
        "score_detail": score_detail(audit),
        "credit_by_consumer": dict(sorted(audit.credit_by_consumer.items())),
        "usage_by_producer": dict(sorted(audit.usage_by_producer.items())),
        "timeline": [
            {
                "round": c.round,
                "block": c.block_number,
                "timestamp": c.timestamp,
                "rollouts": c.rollout_count,
                "external": c.external_count,
                "policy_version": c.policy_version,
            }
            for c in commitments
        ],
        "rounds": [by_round[r] for r in sorted(by_round)],
        "reward_curve": [[e["round"], e["reward_mean"]] for e in (log.rounds if log else [])],
        "rejections": dict(sorted(log.rejections.items())) if log else {},
        "log": log.path if log else None,
    }


def verification_view(
    rollout_hash: bytes, found: Sequence[RolloutVerification], *, searched: int
) -> dict[str, Any]:
    """``/api/verify/{hash}``: the contract's answer for every commitment naming the hash.

    Args:
        searched: journals looked in (0 when the visitor gave the proof).
    """
    rows = [r.as_json() for r in found]
    included = bool(rows) and all(r["included"] for r in rows)
    if not rows:
        message = f"not included: no commitment names this hash in {searched} journal(s)"
    elif included:
        message = f"included: the contract accepted {len(rows)} inclusion proof(s)"
    else:
        refused = sum(not r["included"] for r in rows)
        message = f"not included: the contract refused {refused} of {len(rows)} proof(s)"
    return {
        "rollout_hash": "0x" + rollout_hash.hex(),
        "included": included,
        "found": rows,
        "journals": searched,
        "message": message,
    }
