"""With ``drop_after_answer`` a peer's completions with text after their closing answer tag
are left out of training, so a group whose right answers all carry one (the inject and
tokens attacks) has no spread and is never drawn (issue 23: with the cut alone, two of every
three external groups a defended SmolLM2 node trained on under those attacks were the
attackers' cut groups, and its reward fell to 0.78 and 0.87 of the no-attack run's)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from sapo_async.fabric.collector import BufferedGroup
from sapo_async.node import selection
from sapo_async.node.defence import Thresholds
from sapo_async.node.spec import TrainingSpec
from tests.fixtures.selection import (
    BARE,
    ONE_TAIL,
    RIGHT,
    TAILED,
    WRONG,
    fake_learner,
    scored_group,
    select_one,
)


def _pool(*kinds: tuple[str, tuple[str, ...]]) -> tuple[tuple[BufferedGroup, ...], dict[str, Any]]:
    fresh, scored = [], {}
    for n, (producer, texts) in enumerate(kinds):
        completions = tuple(SimpleNamespace(text=t) for t in texts)
        group = SimpleNamespace(producer=producer, completions=completions)
        fresh.append(BufferedGroup(group, bytes([n]) * 32, 0.0))  # type: ignore[arg-type]
        scored[producer] = scored_group(producer, texts)
    return tuple(fresh), scored


def _learner(scored: dict[str, Any], *, cut: bool, drop: bool) -> Any:
    return fake_learner(lambda group: scored[group.producer], cut=cut, drop=drop)


def _rounds(
    fresh: tuple[BufferedGroup, ...], scored: dict[str, Any], *, cut: bool, drop: bool = False
) -> tuple[Counter[str], list[Any]]:
    """40 rounds of selection from the same pool: who was chosen, and what was trained."""
    learner = _learner(scored, cut=cut, drop=drop)
    counts: Counter[str] = Counter()
    trained: list[Any] = []
    for round_ in range(40):
        choice = select_one(learner, fresh, round_)
        counts.update(c.producer for c in choice.external)
        trained.extend(c.scored for c in choice.external)
    return counts, trained


def _chosen(fresh: tuple[BufferedGroup, ...], scored: dict[str, Any], **kw: bool) -> Counter[str]:
    return _rounds(fresh, scored, **kw)[0]


def test_without_drop_the_attackers_cut_groups_are_drawn_beside_the_honest_one() -> None:
    fresh, scored = _pool(("attacker1", TAILED), ("honest", BARE), ("attacker2", TAILED))
    counts = _chosen(fresh, scored, cut=True)
    assert sum(counts.values()) == 40
    assert counts["honest"] < 30
    assert counts["attacker1"] > 0
    assert counts["attacker2"] > 0


def test_with_drop_a_group_whose_right_answers_all_carry_tails_is_never_trained() -> None:
    fresh, scored = _pool(("attacker1", TAILED), ("honest", BARE), ("attacker2", TAILED))
    assert _chosen(fresh, scored, cut=True, drop=True) == {"honest": 40}
    # Only the attacker's group is informative before the drop; after it, nothing is.
    fresh, scored = _pool(("attacker", TAILED), ("honest", (WRONG,) * 4))
    assert _chosen(fresh, scored, cut=True, drop=True) == {}


def test_with_drop_the_tailed_completions_are_left_out_of_a_group_that_is_trained() -> None:
    fresh, scored = _pool(("rambler", ONE_TAIL))
    counts, trained = _rounds(fresh, scored, cut=True, drop=True)
    assert counts == {"rambler": 40}
    for group in trained:
        assert [c.text for c in group.completions] == [WRONG, RIGHT, WRONG]
        assert group.rewards == [0.0, 1.0, 0.0]


def test_with_drop_a_group_with_every_completion_tailed_is_uninformative_not_an_error() -> None:
    fresh, scored = _pool(("rambler", tuple(t + " Hope that helps." for t in BARE)))
    choice = select_one(_learner(scored, cut=True, drop=True), fresh)
    assert choice.external == []
    assert choice.drops == []
    assert choice.selection.dropped_uninformative == 1


def test_the_completions_left_out_are_counted_by_producer_and_reason() -> None:
    fresh, scored = _pool(("attacker", TAILED), ("rambler", ONE_TAIL), ("honest", (WRONG,) * 4))
    learner = _learner(scored, cut=True, drop=True)
    left_out: dict[str, Counter[str]] = {}
    for round_ in range(40):
        choice = select_one(learner, fresh, round_)
        assert [c.producer for c in choice.external] == ["rambler"]  # the one with spread
        for producer, counts in choice.left_out.items():
            left_out.setdefault(producer, Counter()).update(counts)
    # Counted for every group the draw scored, chosen or not (the attacker's, whenever it
    # was drawn before the rambler's: both its right answers carry the marker).
    assert set(left_out) == {"attacker", "rambler"}
    assert left_out["rambler"] == {"after_answer": 40}
    assert left_out["attacker"]["after_answer"] > 0
    assert left_out["attacker"]["after_answer"] % 2 == 0
    # Without the drop nothing is left out, and nothing is counted.
    assert select_one(_learner(scored, cut=True, drop=False), fresh).left_out == {}


def test_an_oversize_completion_is_refused_though_the_drop_would_leave_it_out() -> None:
    # Before, the size bound read only what was left after the drop: a peer could send a
    # completion of any size after its answer and its group went on to the draw, neither
    # refused nor counted toward quarantine.
    huge = RIGHT + " (*)" * 40  # 179 characters: one token each here
    fresh, scored = _pool(("attacker", (huge, WRONG, RIGHT, WRONG)))
    limits = Thresholds(families={}, max_tokens=64, plausibility=False, length_guard=False)
    choice = select_one(_learner(scored, cut=True, drop=True), fresh, limits=limits)
    assert choice.external == []
    assert [v.reason for v in choice.drops] == ["completion_too_many_tokens"]
    # Within the bound the same group is trained, its tailed completion left out.
    fresh, scored = _pool(("rambler", (RIGHT + " (*)", WRONG, RIGHT, WRONG)))
    choice = select_one(_learner(scored, cut=True, drop=True), fresh, limits=limits)
    assert [c.producer for c in choice.external] == ["rambler"]
    assert choice.left_out == {"rambler": {"after_answer": 1}}


def test_copies_of_a_refused_group_are_refused_without_being_screened_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The flood attack sends each group under four more keys, 20 times each: on SmolLM2
    # with the guard, once the screens refused such copies, every copy the draw reached was
    # tokenised and screened again (honest CPU per round 2.1x the no-attack run's, seed 2).
    huge = RIGHT + " (*)" * 40
    texts = (huge, WRONG, RIGHT, WRONG)
    fresh, scored = _pool(*((f"key{n}", texts) for n in range(10)), ("honest", BARE))
    views: Counter[str] = Counter()
    real_view = selection.candidate_view

    def counted_view(learner: Any, group: Any) -> Any:
        views[group.producer] += 1
        return real_view(learner, group)

    monkeypatch.setattr(selection, "candidate_view", counted_view)
    limits = Thresholds(families={}, max_tokens=64, plausibility=False, length_guard=False)
    choice = selection.select_groups(
        _learner(scored, cut=True, drop=False),
        TrainingSpec(local=1, external=1, sampler="topk"),  # scores every candidate
        0,
        local=[],
        fresh=fresh,
        newest={},
        limits=limits,
    )
    assert [c.producer for c in choice.external] == ["honest"]
    # Every copy dropped and counted against its own key; one of them screened.
    assert sorted(v.producer for v in choice.drops) == sorted(f"key{n}" for n in range(10))
    assert {v.reason for v in choice.drops} == {"completion_too_many_tokens"}
    assert sum(views[f"key{n}"] for n in range(10)) == 1
