"""Contribution score: how much a node's work was used, as far as the chain can tell.

Owns one pure function from on-chain data (``UsageCredited`` events and rounds committed) to
a score per node. It does not read the chain (:mod:`sapo_async.ledger.audit` does) and does
not know who is honest: the caller may name *trusted* consumers (for example the swarm's
own nodes, or nodes the auditor runs); without them every consumer is trusted.

Why not ``creditReceived``: credit is reported by consumers. The contract bounds it (credit
names a round the producer committed, never above what that round shared, never self-credit,
see docs/ledger.md), but two addresses of one person can still credit each other's rounds,
padded to the bound, every round. The score removes what such a clique controls:

1. **Once per consumer round.** A consumer round that credits ``P`` adds at most 1 to ``P``,
   whatever its count, split evenly over the producers it credited in that round. A
   consumer's rounds are therefore worth at most 1 each in total, however large the counts.
2. **Weighted by the consumer's standing.** A trusted consumer's rounds weigh 1. Any other
   consumer ``C`` weighs ``standing(C) = min(1, trusted(C) / rounds(C))``, where
   ``trusted(C)`` is the score ``C`` itself received from trusted consumers and ``rounds(C)``
   the rounds ``C`` committed.

What that guarantees (tested in tests/unit/test_ledger_score.py): everything a non-trusted
consumer ``C`` adds, summed over all the producers it credits, is at most
``standing(C) * rounds(C) <= trusted(C)``. So a clique with no credit from trusted
consumers scores 0, however much it credits itself, and a clique's members can pass on to
each other at most what trusted consumers gave the clique: a colluding pair's score is at
most twice the trusted credit it received, and each member's at most that credit. What it
cannot do: tell an honest consumer that is not trusted and was never used by a trusted one
from a sybil (both weigh 0), or stop a trusted node from colluding; without a trusted set
(everyone trusted) it only removes count inflation (rule 1), so a clique of ``k`` addresses
scores like ``k`` honest consumers would. docs/security.md discusses both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from sapo_async.ledger.types import UsageCredit, checksum

__all__ = ["ContributionScore", "contribution_scores"]


@dataclass(frozen=True, slots=True)
class ContributionScore:
    """One node's score and what it is made of.

    Attributes:
        score: trusted-equivalent consumer rounds that used this node's work (see module).
        from_trusted: the part of ``score`` given by trusted consumers.
        standing: this node's weight as a consumer (1 if trusted, else in ``[0, 1]``).
        consumers: distinct consumers that credited this node.
    """

    node: str
    score: float
    from_trusted: float
    standing: float
    consumers: int


def contribution_scores(
    credits: Iterable[UsageCredit],
    rounds_committed: Mapping[str, int],
    trusted: Collection[str] | None = None,
) -> dict[str, ContributionScore]:
    """Score every node that committed or was credited (pure; see the module docstring).

    Args:
        credits: every ``UsageCredited`` event of the ledger.
        rounds_committed: rounds each node committed (``OnChainTotals.rounds_committed``).
        trusted: consumers whose rounds weigh 1; None trusts every consumer.

    Returns:
        ``{node: ContributionScore}`` for every node in ``rounds_committed`` or ``credits``.

    Raises:
        RejectedInput: a trusted entry is not an address (``bad_address``).
    """
    trust = None if trusted is None else {checksum(t) for t in trusted}
    # (consumer, consumer round) -> producers credited in that round.
    rounds: dict[tuple[str, int], set[str]] = defaultdict(set)
    for u in credits:
        rounds[(u.consumer, u.round)].add(u.producer)
    # share[consumer][producer]: that consumer's rounds, each split over its producers.
    share: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (consumer, _), producers in rounds.items():
        for p in producers:
            share[consumer][p] += 1.0 / len(producers)

    def is_trusted(node: str) -> bool:
        return trust is None or node in trust

    from_trusted: dict[str, float] = defaultdict(float)
    for consumer, given in share.items():
        if is_trusted(consumer):
            for p, amount in given.items():
                from_trusted[p] += amount
    committed = {checksum(n): r for n, r in rounds_committed.items()}
    nodes = set(committed) | {p for g in share.values() for p in g} | set(share)
    standing: dict[str, float] = {}
    for n in nodes:
        own_rounds = max(committed.get(n, 0), 1)
        standing[n] = 1.0 if is_trusted(n) else min(1.0, from_trusted[n] / own_rounds)
    score: dict[str, float] = defaultdict(float)
    consumers: dict[str, set[str]] = defaultdict(set)
    for consumer, given in share.items():
        for p, amount in given.items():
            score[p] += standing[consumer] * amount
            consumers[p].add(consumer)
    return {
        n: ContributionScore(
            node=n,
            score=round(score[n], 6),
            from_trusted=round(from_trusted[n], 6),
            standing=round(standing[n], 6),
            consumers=len(consumers[n]),
        )
        for n in sorted(nodes, key=lambda a: int(a, 16))
    }
