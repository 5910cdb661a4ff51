"""Evidence before influence: a producer's groups are trained only once the quarantine has
the verdicts to judge it (issue 57). Before, a trigger attacker's groups that fit the token
cap were trained in its first rounds, before the refusals of its other groups had
quarantined it (docs/results/attack-real-token-test)."""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace
from typing import Any

from sapo_async.errors import RejectedInput
from sapo_async.fabric.collector import BufferedGroup
from sapo_async.limits import QUARANTINE_MIN_EVENTS
from sapo_async.node.judge import Hold
from sapo_async.node.quarantine import Quarantine
from sapo_async.wire.reasons import RejectReason
from tests.fixtures import selection as fx


def _pool(groups: list[tuple[str, bool]]) -> tuple[tuple[BufferedGroup, ...], Any, Counter[bytes]]:
    """``(producer, refused)`` groups as buffered candidates; a learner whose verifier
    refuses the ``refused`` ones (``task_mismatch``) and scores the rest as an informative
    bare group; and how often it scored each."""
    fresh, refused, calls = [], {}, Counter[bytes]()
    for n, (producer, bad) in enumerate(groups):
        digest = n.to_bytes(32, "big")
        wire = SimpleNamespace(producer=producer, completions=(), digest=digest)
        fresh.append(BufferedGroup(wire, digest, 0.0))  # type: ignore[arg-type]
        refused[digest] = bad

    def score(g: Any) -> Any:
        calls[g.digest] += 1
        if refused[g.digest]:
            raise RejectedInput(RejectReason.TASK_MISMATCH)
        return fx.scored_group(g.producer, fx.BARE)

    return tuple(fresh), fx.fake_learner(score), calls


def _quarantine() -> Quarantine:
    return Quarantine(0.5, QUARANTINE_MIN_EVENTS, 600.0, clock=lambda: 1000.0)


def test_one_verdict_per_group_however_often_it_is_judged() -> None:
    q = Quarantine(0.5, 4, 60.0, clock=lambda: 0.0)
    for _ in range(5):  # one refused group judged five times is one verdict, not five
        assert not q.record("a", True, b"g1")
    assert q.evidence(["a"]).short("a") == 3
    assert not q.record("a", False, b"g2")
    assert not q.record("a", False, b"g3")
    assert q.record("a", True, b"g4")  # 2 of 4 groups
    assert q.blocked("a")


def test_the_snapshot_applies_the_quarantines_own_rule() -> None:
    q = _quarantine()
    for n in range(6):
        q.record("p", n < 2, bytes([n]))
    evidence = q.evidence(["p", "stranger"])
    assert evidence.short("p") == QUARANTINE_MIN_EVENTS - 6
    assert evidence.short("stranger") == QUARANTINE_MIN_EVENTS
    assert evidence.judged("p") == {bytes([n]) for n in range(6)}
    assert not evidence.refuses("p", [False, False])  # 2 of 8
    assert evidence.refuses("p", [True, True])  # 4 of 8, as record() would decide
    assert not evidence.refuses("stranger", [True] * (QUARANTINE_MIN_EVENTS - 1))


def test_a_producer_whose_groups_are_mostly_refused_has_none_trained() -> None:
    # Three groups that pass every check, five the verifier refuses: the trigger family's
    # shape (its groups that fit the token cap pass; the others are refused).
    groups = [("attacker", n % 8 in (1, 3, 5, 6, 7)) for n in range(8)]
    fresh, learner, _ = _pool(groups)
    # The defect: with no evidence asked, the draw trains a group that passed.
    without = [fx.select_one(learner, fresh, r).external for r in range(20)]
    assert any(without)
    for round_ in range(20):
        q = _quarantine()
        choice = fx.select_one(learner, fresh, round_, evidence=q.evidence(["attacker"]))
        assert choice.external == []
        assert len(choice.drops) == 5
        assert len(choice.passed) == 3
        verdicts = [(v.producer, True, v.rollout_hash) for v in choice.drops]
        verdicts += [(p, False, h) for p, h in choice.passed]
        assert q.record_all(verdicts) == ["attacker"]


def _clean_verdicts_to_clear() -> int:
    """How many verdicts with no drop clear a new producer (5 at rate 0.5 of 8)."""
    fresh = _quarantine().evidence([])
    return next(k for k in range(QUARANTINE_MIN_EVENTS + 1) if fresh.cleared("p", [False] * k))


def test_clearing_early_never_draws_a_producer_the_rule_refuses_at_its_first_decision() -> None:
    # Every sequence of verdicts up to the quarantine's minimum: a producer cleared after a
    # prefix of it is not refused at the minimum, whatever the rest of the sequence.
    evidence = _quarantine().evidence([])
    for bits in itertools.product([False, True], repeat=QUARANTINE_MIN_EVENTS):
        refused = evidence.refuses("p", bits)
        for k in range(QUARANTINE_MIN_EVENTS + 1):
            if evidence.cleared("p", bits[:k]):
                assert not refused, bits
    assert _clean_verdicts_to_clear() == 5
    assert not evidence.cleared("p", [False] * 4 + [True])  # 1 drop in 5: 4 of 8 possible


def test_a_new_peer_waits_only_until_the_quarantine_has_cleared_it() -> None:
    q = _quarantine()
    clean = _clean_verdicts_to_clear()
    first = [("peer", False)] * (clean - 1)
    fresh, learner, calls = _pool(first)
    choice = fx.select_one(learner, fresh, 0, evidence=q.evidence(["peer"]))
    assert choice.external == []
    assert choice.held == {Hold.EVIDENCE: len(first)}
    q.record_all((p, False, h) for p, h in choice.passed)
    # The next round: three more groups arrive; only the one it lacks is judged for the
    # count, and the peer is drawn in the same round.
    fresh, learner, calls = _pool(first + [("peer", False)] * 3)
    choice = fx.select_one(learner, fresh, 1, evidence=q.evidence(["peer"]))
    assert [c.producer for c in choice.external] == ["peer"]
    assert choice.held == {}
    assert (len(first)).to_bytes(32, "big") in {h for _, h in choice.passed}
    assert max(calls.values()) == 1  # no group scored twice in a round


def test_a_peer_with_enough_verdicts_is_drawn_as_before() -> None:
    q = _quarantine()
    for n in range(QUARANTINE_MIN_EVENTS):
        q.record("peer", False, b"old" + bytes([n]))
    fresh, learner, calls = _pool([("peer", False)] * 4)
    choice = fx.select_one(learner, fresh, 0, evidence=q.evidence(["peer"]))
    assert [c.producer for c in choice.external] == ["peer"]
    assert sum(calls.values()) == 1  # nothing judged for the count: the draw's one pick
