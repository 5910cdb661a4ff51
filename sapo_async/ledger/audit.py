"""Audit: what each node committed and how much of its work others used, read from chain.

Owns the audit read model (:class:`NodeAudit`), rollout verification against the chain
(:func:`verify_rollout`) and the expected numbers derived from commitments a node made
(:func:`expected_participation`, for comparing with what the chain says). It returns rows
(:class:`NodeAudit`, :class:`RolloutVerification`) and does not know how they are shown:
the tables the CLI and the local swarm print are :mod:`sapo_async.cli.audit`'s. It reads
only through the :class:`Ledger` port and, for verification, local journals (the chain
stores roots, not rollout hashes, so finding which (node, round) committed a hash needs an
index of published hashes: the journal is one).
The contribution score (what a clique of colluding addresses cannot inflate) is computed by
:func:`sapo_async.ledger.score.contribution_scores` from the chain's credit events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from sapo_async.ledger.base import Ledger
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.score import ContributionScore, contribution_scores
from sapo_async.ledger.types import RoundCommitment, checksum

__all__ = [
    "NodeAudit",
    "Participation",
    "RolloutVerification",
    "audit_node",
    "audit_swarm",
    "expected_participation",
    "ledger_scores",
    "verify_rollout",
]


@dataclass(frozen=True, slots=True)
class Participation:
    """The numbers an audit reports for one node, comparable across sources.

    Attributes:
        rounds_committed: rounds with a commitment.
        rollouts_committed: rollouts the node shared (committed in its rollout roots).
        external_used: external rollouts the node trained on.
        credit_received: rollouts of this node that other nodes trained on.
    """

    rounds_committed: int = 0
    rollouts_committed: int = 0
    external_used: int = 0
    credit_received: int = 0


@dataclass(frozen=True, slots=True)
class NodeAudit:
    """One node's audit as the chain reports it.

    Attributes:
        credit_by_consumer: who trained on this node's rollouts, and how many (from events).
        usage_by_producer: whose rollouts this node trained on, and how many (from events).
        score: the node's contribution score (None when the events were not read).
    """

    node: str
    registered: bool
    metadata: str
    last_round: int | None
    participation: Participation
    credit_by_consumer: dict[str, int] = field(default_factory=dict)
    usage_by_producer: dict[str, int] = field(default_factory=dict)
    score: ContributionScore | None = None


async def ledger_scores(
    ledger: Ledger, trusted: Iterable[str] | None = None
) -> dict[str, ContributionScore]:
    """Contribution scores of every node, from the chain's ``UsageCredited`` events and each
    consumer's rounds (see :mod:`sapo_async.ledger.score`; ``trusted`` as there).

    Raises:
        RejectedInput: a trusted entry is not an address.
        LedgerUnavailable: the chain cannot be reached.
    """
    credits = await ledger.usage_credits()
    nodes = set(await ledger.nodes()) | {u.consumer for u in credits}
    rounds = {n: (await ledger.node_stats(n)).rounds_committed for n in sorted(nodes)}
    return contribution_scores(credits, rounds, None if trusted is None else list(trusted))


async def audit_node(
    ledger: Ledger, node: str, *, breakdown: bool = True, trusted: Iterable[str] | None = None
) -> NodeAudit:
    """Read ``node``'s totals and usage credit from the chain.

    Args:
        ledger: the swarm's ledger.
        node: the node's address.
        breakdown: also read the per-consumer and per-producer usage from the
            ``UsageCredited`` events (an event scan from the deployment block; the totals
            come from view calls and are always read), and the contribution score.
        trusted: consumers whose credit weighs fully in the score (None: all).

    Raises:
        RejectedInput: ``node`` is not an address.
        LedgerUnavailable: the chain cannot be reached.
    """
    address = checksum(node)
    stats = await ledger.node_stats(address)
    credit: Counter[str] = Counter()
    usage: Counter[str] = Counter()
    score = None
    if breakdown:
        for u in await ledger.usage_credits(producer=address):
            credit[u.consumer] += u.count
        for u in await ledger.usage_credits(consumer=address):
            usage[u.producer] += u.count
        score = (await ledger_scores(ledger, trusted)).get(address)
    return NodeAudit(
        node=address,
        registered=stats.registered,
        metadata=stats.metadata,
        last_round=stats.last_round,
        participation=Participation(
            rounds_committed=stats.rounds_committed,
            rollouts_committed=stats.rollouts_committed,
            external_used=stats.external_used,
            credit_received=stats.credit_received,
        ),
        credit_by_consumer=dict(credit),
        usage_by_producer=dict(usage),
        score=score,
    )


async def audit_swarm(
    ledger: Ledger, *, breakdown: bool = True, trusted: Iterable[str] | None = None
) -> list[NodeAudit]:
    """Audit every registered node, in registration order (``breakdown`` and ``trusted`` as
    in :func:`audit_node`; the in-process EVM scans events slowly, so the local swarm's
    closing table reads the totals only)."""
    audits = [await audit_node(ledger, node, breakdown=False) for node in await ledger.nodes()]
    if not breakdown:
        return audits
    scores = await ledger_scores(ledger, trusted)
    out = []
    for a in audits:
        credit: Counter[str] = Counter()
        usage: Counter[str] = Counter()
        for u in await ledger.usage_credits(producer=a.node):
            credit[u.consumer] += u.count
        for u in await ledger.usage_credits(consumer=a.node):
            usage[u.producer] += u.count
        out.append(
            replace(
                a,
                credit_by_consumer=dict(credit),
                usage_by_producer=dict(usage),
                score=scores.get(a.node),
            )
        )
    return out


def expected_participation(commitments: Iterable[RoundCommitment]) -> dict[str, Participation]:
    """What an audit should report, computed from the commitments nodes made (pure).

    Feed it every commitment that landed (for example from the nodes' journals) and compare
    with ``{a.node: a.participation for a in await audit_swarm(ledger)}``. Producers that
    only ever received credit appear too.
    """
    rounds: Counter[str] = Counter()
    rollouts: Counter[str] = Counter()
    used: Counter[str] = Counter()
    credit: Counter[str] = Counter()
    for c in commitments:
        rounds[c.node] += 1
        rollouts[c.node] += len(c.rollout_hashes)
        used[c.node] += c.external_count
        for producer, _, hashes in c.usage():
            credit[producer] += len(hashes)
    return {
        node: Participation(rounds[node], rollouts[node], used[node], credit[node])
        for node in sorted(set(rounds) | set(credit))
    }


@dataclass(frozen=True, slots=True)
class RolloutVerification:
    """The outcome of checking one (node, round) that claims a rollout hash.

    Attributes:
        kind: ``"own"`` (the node shared it) or ``"external"`` (the node trained on it).
        included: the contract accepted the inclusion proof.
        proof: the sibling path sent to the contract.
    """

    rollout_hash: bytes
    node: str
    round: int
    kind: str
    producer: str
    included: bool
    proof: list[bytes]

    def as_json(self) -> dict[str, object]:
        """The row the audit command and the explorer print (hex proof, no hash)."""
        return {
            "node": self.node,
            "round": self.round,
            "kind": self.kind,
            "producer": self.producer,
            "included": self.included,
            "proof": ["0x" + p.hex() for p in self.proof],
        }


async def verify_rollout(
    ledger: Ledger, journals: Sequence[Journal], rollout_hash: bytes
) -> list[RolloutVerification]:
    """Find every commitment naming ``rollout_hash`` in ``journals`` and check it on chain.

    The journal provides the round's full hash list, from which the proof is rebuilt; the
    contract then checks the proof against the root it stores, so a journal cannot vouch
    for a hash the chain never committed.

    Returns:
        One verification per (node, round, kind) found; empty if no journal knows the hash.
    """
    results: list[RolloutVerification] = []
    for journal in journals:
        for where in journal.find_rollout(rollout_hash):
            entry = journal.entry(where.node, where.round)
            if entry is None:
                continue
            c = entry.commitment
            if where.kind == "own":
                proof = c.rollout_tree().proof(rollout_hash)
                ok = await ledger.is_rollout_included(c.node, c.round, rollout_hash, proof)
            else:
                proof = c.external_tree().proof(rollout_hash)
                ok = await ledger.is_external_included(c.node, c.round, rollout_hash, proof)
            results.append(
                RolloutVerification(
                    rollout_hash, c.node, c.round, where.kind, where.producer, ok, proof
                )
            )
    return results
