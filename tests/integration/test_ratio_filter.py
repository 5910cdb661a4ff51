"""The importance-ratio filter on external groups (F-TIS-style) with a real tiny model."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from sapo_async.errors import ConfigError
from sapo_async.node.filters import RatioFilter


@pytest.fixture
def learner_and_groups(tiny_lm):
    from sapo_async.node.learner import build_learner
    from sapo_async.node.spec import NodeSpec

    spec = NodeSpec.build(
        model=tiny_lm,
        prompt_style="compact",
        tasks="cpu_easy",
        questions_per_round=2,
        local=2,
        external=2,
        completions_per_question=4,
    )
    learner = build_learner(spec)
    groups = learner.score_local(anyio.run(learner.generate, 0))
    return learner, groups


def _shift(group, delta):
    comps = tuple(
        dataclasses.replace(c, behaviour_logprobs=tuple(x + delta for x in c.behaviour_logprobs))
        for c in group.completions
    )
    return dataclasses.replace(group, completions=comps, producer="0xpeer")


def test_a_group_from_the_receivers_own_policy_passes_with_ratio_one(learner_and_groups):
    learner, groups = learner_and_groups
    check = RatioFilter(cap=1.5)
    for g in groups:
        assert check(learner, dataclasses.replace(g, producer="0xpeer")) is None
    assert len(check.log_ratios) == sum(len(g.completions) for g in groups)
    assert max(abs(r) for r in check.log_ratios) < 1e-3
    assert check.dropped == 0


def test_a_group_the_producer_found_far_likelier_or_unlikelier_is_dropped(learner_and_groups):
    learner, groups = learner_and_groups
    check = RatioFilter(cap=1.5)  # |log ratio| must stay below log 1.5 = 0.405
    assert check(learner, _shift(groups[0], -1.0)) == "ratio_extreme"  # ratio e^1
    assert check(learner, _shift(groups[0], +1.0)) == "ratio_extreme"  # ratio e^-1
    assert check(learner, _shift(groups[0], -0.2)) is None  # ratio e^0.2 = 1.22
    assert check.dropped == 2


def test_a_group_under_another_tokenizer_passes_unmeasured(learner_and_groups):
    learner, groups = learner_and_groups
    check = RatioFilter(cap=1.5)
    other = dataclasses.replace(_shift(groups[0], -5.0), tokenizer_id="0xother")
    assert check(learner, other) is None
    assert check.log_ratios == []


def test_a_cap_that_keeps_nothing_is_refused():
    with pytest.raises(ConfigError, match="cap must be > 1"):
        RatioFilter(cap=1.0)
