"""The contribution score: what a clique of colluding addresses can and cannot raise."""

from __future__ import annotations

import os

import anyio
import pytest
from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo_async.cli.audit import swarm_table
from sapo_async.errors import RejectedInput
from sapo_async.ledger import MemoryLedger, RoundCommitment
from sapo_async.ledger.audit import audit_swarm, ledger_scores
from sapo_async.ledger.score import contribution_scores
from sapo_async.ledger.types import MAX_ROLLOUTS_PER_ROUND, UsageCredit

NODES = [f"0x{i:040x}" for i in range(1, 9)]
A, B, C, D = (Account.create().address for _ in range(4))


def credit(producer: str, consumer: str, round_: int, count: int = 1) -> UsageCredit:
    return UsageCredit(producer, consumer, round_, count, block_number=1, producer_round=0)


def test_a_consumer_round_adds_at_most_one_whatever_its_count():
    scores = contribution_scores(
        [credit(A, C, 1, 4096), credit(B, C, 2, 1), credit(A, C, 3, 1), credit(B, C, 3, 7)],
        {C: 3},
    )
    assert scores[A].score == 1.5  # round 1 whole, half of round 3
    assert scores[B].score == 1.5
    assert scores[C].score == 0


def test_a_clique_without_trusted_credit_scores_nothing():
    clique = [
        credit(p, c, r, 4096) for r in range(50) for p in (A, B, C) for c in (A, B, C) if p != c
    ]
    scores = contribution_scores(clique, dict.fromkeys((A, B, C), 50), trusted=[D])
    assert all(scores[n].score == 0 for n in (A, B, C))
    # Without a trusted set every consumer counts: only count inflation is removed.
    open_scores = contribution_scores(clique, dict.fromkeys((A, B, C), 50))
    assert open_scores[A].score == 50  # two consumers, 50 rounds, each round split in two


def test_untrusted_honest_consumer_gains_standing_from_trusted_use():
    events = [credit(B, A, r) for r in range(4)] + [credit(C, B, r) for r in range(2)]
    scores = contribution_scores(events, {A: 4, B: 4}, trusted=[A])
    assert scores[B].standing == 1.0  # trusted A used B in all of B's 4 rounds
    assert scores[C].score == 2.0  # so B's use of C counts fully


def test_bad_trusted_address_is_rejected():
    with pytest.raises(RejectedInput) as info:
        contribution_scores([], {}, trusted=["nope"])
    assert info.value.reason == "bad_address"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(NODES), st.sampled_from(NODES), st.integers(0, 6)),
        max_size=60,
    ),
    st.sets(st.sampled_from(NODES), max_size=4),
    st.sets(st.sampled_from(NODES), min_size=1, max_size=4),
)
def test_what_a_clique_gives_itself_never_exceeds_what_trusted_consumers_gave_it(
    edges: list[tuple[str, str, int]], clique: set[str], trusted: set[str]
):
    clique -= trusted  # colluders are not trusted (a trusted colluder is out of scope)
    events = [credit(p, c, r) for p, c, r in edges if p != c]
    rounds = {n: 1 + max((r for _, c, r in edges if c == n), default=0) for n in NODES}
    with_clique = contribution_scores(events, rounds, trusted)
    outside = [u for u in events if not (u.consumer in clique and u.producer in clique)]
    without = contribution_scores(outside, rounds, trusted)
    gained = sum(
        with_clique[n].score - (without[n].score if n in without else 0.0)
        for n in clique
        if n in with_clique
    )
    given_by_trusted = sum(with_clique[n].from_trusted for n in clique if n in with_clique)
    assert gained <= given_by_trusted + 1e-6


def test_colluding_pair_on_a_ledger_scores_no_more_than_honest_credit():
    """Two addresses of one person share padded rounds and credit each other to the contract's
    bound every round; honest (trusted) consumers use one of them twice. Raw credit rewards
    the pair with tens of thousands of rollouts; the score gives it the honest credit only."""

    async def scenario() -> None:
        ledger = MemoryLedger("collusion")
        honest = [Account.create() for _ in range(2)]
        mallory, sybil = Account.create(), Account.create()
        for n in (*honest, mallory, sybil):
            await ledger.register(n)
        pad = MAX_ROLLOUTS_PER_ROUND // 2
        shared: dict[str, list[bytes]] = {}
        for r in range(1, 9):  # both share a padded round, then credit the other's whole round
            for n in (mallory, sybil):
                shared[n.address] = [os.urandom(32) for _ in range(pad)]
                await ledger.submit(
                    n, RoundCommitment(n.address, 2 * r, r, shared[n.address]).payload()
                )
            for n, other in ((mallory, sybil), (sybil, mallory)):
                used = {other.address: {2 * r: shared[other.address]}}
                await ledger.submit(n, RoundCommitment(n.address, 2 * r + 1, r, [], used).payload())
        for h in honest:  # each honest consumer uses one mallory rollout once
            used = {mallory.address: {2: [os.urandom(32)]}}
            await ledger.submit(h, RoundCommitment(h.address, 1, 1, [], used).payload())

        assert await ledger.credit_received(mallory.address) == 8 * pad + 2
        assert await ledger.credit_received(sybil.address) == 8 * pad
        trusted = [h.address for h in honest]
        scores = await ledger_scores(ledger, trusted)
        honest_credit = 2.0  # two honest consumer rounds
        assert scores[mallory.address].from_trusted == honest_credit
        assert scores[sybil.address].from_trusted == 0
        assert scores[mallory.address].score <= honest_credit + 1e-9
        assert scores[sybil.address].score <= honest_credit + 1e-9
        # mallory's standing is 2 trusted rounds over her 16 rounds: she passes on 2/16 per round
        assert scores[sybil.address].score == pytest.approx(8 * 2 / 16)
        audits = await audit_swarm(ledger, trusted=trusted)
        by_node = {a.node: a for a in audits}
        assert by_node[mallory.address].score == scores[mallory.address]
        assert swarm_table(audits).columns[-1].header == "score"

    anyio.run(scenario)
