import random
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapo_async.errors import RejectedInput
from sapo_async.node.sampler import (
    is_informative,
    select_external,
    select_local,
)


@dataclass(frozen=True)
class G:
    producer: str
    rewards: tuple[float, ...]


def identity(g: G) -> G:
    return g


def test_is_informative_needs_two_different_rewards():
    assert not is_informative([])
    assert not is_informative([1.0])
    assert not is_informative([0.5, 0.5, 0.5])
    assert is_informative([0.0, 0.0, 1.0])


def test_select_local_takes_the_first_i_in_generation_order():
    assert select_local(["a", "b", "c"], 2) == ["a", "b"]
    assert select_local(["a"], 4) == ["a"]
    with pytest.raises(ValueError, match="local count"):
        select_local(["a"], -1)


def test_paper_policy_drops_all_equal_groups_and_returns_only_informative():
    pool = [G("p1", (1.0, 1.0)), G("p2", (0.0, 1.0)), G("p3", (0.0, 0.0)), G("p4", (1.0, 0.0))]
    sel = select_external(pool, 4, identity, rng=random.Random(0))
    assert sorted(g.producer for g in sel.chosen) == ["p2", "p4"]
    assert sel.dropped_uninformative == 2
    assert sel.scored == 4


def test_paper_policy_stops_scoring_once_it_has_j():
    pool = [G(f"p{i}", (0.0, 1.0)) for i in range(20)]
    calls = []

    def score(g: G) -> G:
        calls.append(g)
        return g

    sel = select_external(pool, 3, score, rng=random.Random(1))
    assert len(sel.chosen) == 3
    assert len(calls) == 3


def test_paper_policy_is_uniform_over_informative_groups():
    pool = [G(f"p{i}", (0.0, 1.0)) for i in range(4)] + [G("flat", (1.0, 1.0))] * 4
    counts: Counter[str] = Counter()
    rng = random.Random(7)
    trials = 4000
    for _ in range(trials):
        for g in select_external(pool, 1, identity, rng=rng).chosen:
            counts[g.producer] += 1
    assert "flat" not in counts
    for i in range(4):
        # each informative group is chosen about 1/4 of the time
        assert abs(counts[f"p{i}"] / trials - 0.25) < 0.04


def test_per_producer_cap_limits_groups_from_one_peer():
    pool = [G("greedy", (0.0, 1.0))] * 10 + [G("other", (0.0, 1.0))] * 2
    sel = select_external(pool, 6, identity, rng=random.Random(3), per_producer_cap=2)
    by = Counter(g.producer for g in sel.chosen)
    assert by == {"greedy": 2, "other": 2}
    assert sel.dropped_capped > 0


def test_topk_policy_prefers_highest_mean_reward():
    pool = [G("low", (0.0, 0.2)), G("high", (0.0, 1.0)), G("mid", (0.0, 0.6))]
    sel = select_external(pool, 2, identity, rng=random.Random(0), policy="topk")
    assert [g.producer for g in sel.chosen] == ["high", "mid"]


def test_fallback_when_pool_is_short_trains_on_what_is_there():
    sel = select_external([G("a", (0.0, 1.0))], 4, identity, rng=random.Random(0))
    assert len(sel.chosen) == 1
    assert select_external([], 4, identity, rng=random.Random(0)).chosen == []


def test_scoring_refusals_are_counted_by_reason_and_bugs_are_raised():
    def score(g: G) -> G:
        if g.producer == "liar":
            raise RejectedInput("task_mismatch", "answer mismatch")
        if g.producer == "bug":
            raise KeyError("a bug, not a peer's fault")
        return g

    pool = [G("liar", (0.0, 1.0)), G("honest", (0.0, 1.0))]
    sel = select_external(pool, 2, score, rng=random.Random(0), on_error=lambda _c, e: e.reason)
    assert [g.producer for g in sel.chosen] == ["honest"]
    assert sel.failed == {"task_mismatch": 1}
    with pytest.raises(RejectedInput, match="answer mismatch"):
        select_external(pool, 2, score, rng=random.Random(0))
    with pytest.raises(KeyError):
        select_external([G("bug", (0.0, 1.0))], 1, score, rng=random.Random(0), on_error=str)


def test_bad_arguments_name_what_was_wrong():
    with pytest.raises(ValueError, match="external count"):
        select_external([], -1, identity, rng=random.Random(0))
    with pytest.raises(ValueError, match="policy"):
        select_external([], 1, identity, rng=random.Random(0), policy="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per_producer_cap"):
        select_external([], 1, identity, rng=random.Random(0), per_producer_cap=0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcde"),
            st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=4),
        ),
        max_size=30,
    ),
    st.integers(0, 10),
    st.one_of(st.none(), st.integers(1, 3)),
    st.sampled_from(["paper", "topk"]),
    st.integers(0, 2**32),
)
def test_selection_invariants_hold_for_any_pool(raw, j, cap, policy, seed):
    pool = [G(p, tuple(r)) for p, r in raw]
    sel = select_external(
        pool, j, identity, rng=random.Random(seed), policy=policy, per_producer_cap=cap
    )
    assert len(sel.chosen) <= j
    assert all(is_informative(g.rewards) for g in sel.chosen)
    if cap is not None:
        assert max(Counter(g.producer for g in sel.chosen).values(), default=0) <= cap
    available = sum(1 for g in pool if is_informative(g.rewards))
    if cap is None:
        assert len(sel.chosen) == min(j, available)
