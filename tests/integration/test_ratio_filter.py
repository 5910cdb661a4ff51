"""The importance-ratio filter on external groups (F-TIS-style) with a real tiny model."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from sapo_async.errors import ConfigError
from sapo_async.node.filters import RatioFilter
from sapo_async.node.judge import candidate_view
from sapo_async.policy.grpo.batch import TokenSource


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


def _view(learner, group):
    """The round's view of ``group`` as if a peer had sent it (its ids are a claim)."""
    peer = dataclasses.replace(group, producer="0xpeer", token_source=TokenSource.TEXT)
    return candidate_view(learner, peer)


def _shift(learner, group, delta):
    comps = tuple(
        dataclasses.replace(c, behaviour_logprobs=tuple(x + delta for x in c.behaviour_logprobs))
        for c in group.completions
    )
    return _view(learner, dataclasses.replace(group, completions=comps))


def test_a_group_from_the_receivers_own_policy_passes_with_ratio_one(learner_and_groups):
    learner, groups = learner_and_groups
    check = RatioFilter(cap=1.5)
    for g in groups:
        assert check(_view(learner, g)) is None
    assert len(check.log_ratios) == sum(len(g.completions) for g in groups)
    assert max(abs(r) for r in check.log_ratios) < 1e-3
    assert check.dropped == 0


def test_a_group_the_producer_found_far_likelier_or_unlikelier_is_dropped(learner_and_groups):
    learner, groups = learner_and_groups
    check = RatioFilter(cap=1.5)  # |log ratio| must stay below log 1.5 = 0.405
    assert check(_shift(learner, groups[0], -1.0)) == "ratio_extreme"  # ratio e^1
    assert check(_shift(learner, groups[0], +1.0)) == "ratio_extreme"  # ratio e^-1
    assert check(_shift(learner, groups[0], -0.2)) is None  # ratio e^0.2 = 1.22
    assert check.dropped == 2


def test_a_group_under_another_tokenizer_passes_unmeasured(learner_and_groups):
    learner, groups = learner_and_groups
    check = RatioFilter(cap=1.5)
    shifted = _shift(learner, groups[0], -5.0).scored
    assert check(_view(learner, dataclasses.replace(shifted, tokenizer_id="0xother"))) is None
    assert check.log_ratios == []


def test_a_cap_that_keeps_nothing_is_refused():
    with pytest.raises(ConfigError, match="cap must be > 1"):
        RatioFilter(cap=1.0)
