"""The tail record (``[defence] tail_share``, off by default): a producer whose rewarded
answers mostly carry text after the closing answer tag gets those completions left out (as
``drop_after_answer`` does for everyone), while a peer that tails now and then stays cut
only (issue 23: with the cut alone, the inject and tokens attackers' cut groups filled two
of every three external slots of a defended SmolLM2 node; ``drop_after_answer`` stopped
that but cost the no-attack swarm its sharing gain, 1.18 to 0.99)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from sapo_async.fabric.collector import BufferedGroup
from sapo_async.node.tails import MIN_ANSWERS, WINDOW_GROUPS, TailObservation, TailRecord
from tests.fixtures import selection as fx


def _pool(groups: list[tuple[str, tuple[str, ...]]]) -> tuple[tuple[BufferedGroup, ...], Any]:
    """Buffered groups (each its own hash) and a scorer that marks the right answers."""
    fresh, scored = [], {}
    for n, (producer, texts) in enumerate(groups):
        digest = n.to_bytes(32, "big")
        group = SimpleNamespace(producer=producer, completions=(), digest=digest)
        fresh.append(BufferedGroup(group, digest, 0.0))  # type: ignore[arg-type]
        scored[digest] = fx.scored_group(producer, texts)
    return tuple(fresh), lambda group: scored[group.digest]


def _rounds(
    groups: list[tuple[str, tuple[str, ...]]], record: TailRecord | None, rounds: int = 40
) -> tuple[list[Counter[str]], list[Any], list[str]]:
    """Rounds of J = 1 from the same pool, the record kept as a node keeps it (a copy to
    the selection, the observations back): who was chosen each round, what was trained
    (hash, group), and the producers the record flagged."""
    fresh, score = _pool(groups)
    learner = fx.fake_learner(score, cut=True, drop=False)
    chosen: list[Counter[str]] = []
    trained: list[Any] = []
    flagged: list[str] = []
    for round_ in range(rounds):
        choice = fx.select_one(learner, fresh, round_, record.copy() if record else None)
        if record is not None:
            flagged += record.observe(choice.tails)
        chosen.append(Counter(c.producer for c in choice.external))
        trained.extend((c.buffered.rollout_hash, c.scored) for c in choice.external)
    return chosen, trained, flagged


ATTACKED = [("attacker", fx.TAILED)] * 6 + [("honest", fx.BARE)] * 2 + [("honest", fx.ONE_TAIL)]


def test_with_the_cut_alone_an_attacker_that_tails_every_right_answer_keeps_its_slots() -> None:
    chosen, _, _ = _rounds(ATTACKED, None)
    late = sum(chosen[10:], Counter())
    assert late["attacker"] > late["honest"]


def test_the_record_leaves_out_a_tailing_attacker_and_keeps_an_honest_peer_that_rambles() -> None:
    chosen, trained, flagged = _rounds(ATTACKED, TailRecord(0.5))
    assert flagged == ["attacker"]
    # Once flagged (after 8 rewarded answers: four of its groups), never trained again.
    late = sum(chosen[10:], Counter())
    assert late == {"honest": 30}
    # The honest peer's tailed right answer (one in six of its) is still trained: cut.
    rambled = dict(trained)[(len(ATTACKED) - 1).to_bytes(32, "big")]
    assert [c.text for c in rambled.completions] == [fx.RIGHT, fx.WRONG, fx.RIGHT, fx.WRONG]
    assert all(len(g.completions) == 4 for _, g in trained)


def test_a_peer_that_tails_half_its_right_answers_is_flagged_at_the_default_share() -> None:
    _chosen, trained, flagged = _rounds([("rambler", fx.ONE_TAIL)] * 6, TailRecord(0.5))
    assert flagged == ["rambler"]
    # Its groups are still trained, on the completions that end at their answer.
    assert [c.text for c in trained[-1][1].completions] == [fx.WRONG, fx.RIGHT, fx.WRONG]


def test_the_share_needs_enough_answers_and_reads_the_newest_groups_each_once() -> None:
    record = TailRecord(0.5)
    tailed = [TailObservation(bytes([n]) * 32, "p", 2, 2) for n in range(MIN_ANSWERS // 2)]
    assert record.observe(tailed[:-1]) == []  # 6 answers: too few to judge
    assert record.observe(tailed[-2:]) == ["p"]  # the repeat counts once
    assert record.observe(tailed) == []  # already heavy: not reported again
    bare = [TailObservation(bytes([100 + n]) * 32, "p", 0, 2) for n in range(WINDOW_GROUPS)]
    record.observe(bare[:4])
    assert record.heavy("p")  # 8 of 16 answers tailed: the share is reached
    record.observe(bare[4:5])
    assert not record.heavy("p")  # 8 of 18
    assert not record.heavy("someone else")
    # Only the newest WINDOW_GROUPS count: a producer that tailed long ago is judged
    # on what it sends now.
    record.observe(bare)
    late = [TailObservation(bytes([200 + n]) * 32, "p", 1, 2) for n in range(WINDOW_GROUPS)]
    assert record.observe(late) == ["p"]  # 1 of 2 each: half, once the bare ones are out


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="tail_share"):
        TailRecord(share)


def test_groups_with_nothing_rewarded_do_not_dilute_a_producers_share() -> None:
    # An attacker that pads its stream with groups of no spread (all wrong) must not push
    # its tailed answers out of the window or below the share.
    padded = [("attacker", fx.TAILED), *[("attacker", (fx.WRONG,) * 4)] * 5] * 4
    _, trained, flagged = _rounds([*padded, ("honest", fx.BARE)], TailRecord(0.5), rounds=60)
    assert flagged == ["attacker"]
    assert [g.producer for _, g in trained[-20:]] == ["honest"] * 20
