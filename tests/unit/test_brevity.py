"""The brevity guard (``[defence] brevity_guard``): a rewarded peer completion that shows far
less text before its answer than the node's own completions do condemns its group.

Issue 23: with the cut on, the inject and tokens attackers' rewarded completions are bare
answers, informative in every group; training on them cost SmolLM2's honest nodes about a
quarter of their reward. SmolLM2's own completions (instruct prompt) show work before the
answer in all but 1 of 384; the tiny model's (compact prompt) never do, and there the guard
must never fire.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from sapo_async.fabric.collector import BufferedGroup
from sapo_async.node.defence import Calibration, CompletionView, Thresholds, screen
from sapo_async.node.groups import SharedRound
from sapo_async.node.selection import calibrate
from sapo_async.node.spec import DefenceSpec
from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup
from sapo_async.tasks.reward import answer_lead, own_lead
from tests.fixtures.selection import (
    BARE,
    RIGHT,
    TAILED,
    WRONG,
    fake_learner,
    scored_group,
    select_one,
)

WORKED = (" 2 + 3 = 5." + RIGHT, " 2 + 3 = 7." + WRONG, " 2 + 3 = 5." + RIGHT, WRONG)
"""An honest SmolLM2-like group: the sum worked, then the answer (one bare wrong one)."""


@pytest.mark.parametrize(
    ("text", "lead"),
    [
        (" <answer>5</answer>", 0),
        (" <answer>5</answer> (*)(*)", 0),
        (" 2 + 3 = 5. <answer>5</answer>", 10),
        ("2 + 3 <answer>4</answer> so <answer>5</answer>", 27),
        ("<answer> <answer>5</answer>", 8),
        ("no tags at all ", 14),
        ("", 0),
    ],
)
def test_answer_lead_counts_the_text_before_the_last_answer(text: str, lead: int) -> None:
    assert answer_lead(text) == lead


def _calibration(leads: list[str], families: tuple[str, ...] = ("chain_sum",)) -> Calibration:
    spec = DefenceSpec(
        brevity_guard=True, plausibility=False, length_guard=False, calibration_min=8
    )
    cal = Calibration(spec, max_new_tokens=48)
    for i, lead in enumerate(leads):
        cal.observe(families[i % len(families)], [-0.5] * 8, 0.0, f"{lead}{RIGHT}")
    return cal


def test_the_floor_is_the_own_quantile_over_the_factor_once_calibrated() -> None:
    works = ["2 + 3 = 5."] * 19 + ["5."]  # 10 characters; one in 20 shows 2
    assert _calibration(works[:7]).thresholds().limits("chain_sum").min_rewarded_lead is None
    limits = _calibration(works).thresholds()
    assert limits.brevity_guard
    # The 5th percentile of 20 leads is the second shortest (10; one bare-ish answer in 20
    # does not lower it), over 2.
    assert limits.limits("chain_sum").min_rewarded_lead == 5


def test_screen_drops_a_rewarded_bare_answer_and_keeps_worked_or_unrewarded_ones() -> None:
    limits = _calibration(["2 + 3 = 5."] * 20).thresholds()
    bare = CompletionView([], 1.0, (), RIGHT)
    worked = CompletionView([], 1.0, (), " 2 + 3 = 5." + RIGHT)
    wrong_bare = CompletionView([], 0.0, (), WRONG)
    assert screen("chain_sum", [bare], limits) == "too_brief"
    assert screen("chain_sum", [worked, wrong_bare], limits) is None


def test_a_model_that_answers_bare_gets_a_floor_of_zero_and_the_guard_never_fires() -> None:
    limits = _calibration([""] * 40).thresholds()  # the tiny model's compact prompt
    assert limits.limits("chain_sum").min_rewarded_lead == 0
    assert screen("chain_sum", [CompletionView([], 1.0, (), RIGHT)], limits) is None


@pytest.mark.parametrize(
    ("text", "finish_reason", "lead"),
    [
        (" 2 + 3 = 5. <answer>5</answer>", "stop", 10),
        (" 2 + 3 = 5. <answer>5</answer>", "length", 10),
        (" <answer>5</answer>", "stop", 0),
        (" 10", "stop", None),  # ended without answering: tells nothing
        (" 2 + 3 = 5. So the", "stop", None),
        (" 2 + 3 = 5. So the", "length", 17),  # cut before answering: at least this
        (" 2 + 3 = 5. <answer>", "length", 10),  # cut inside its answer: exactly this
        (" <answer>1", "length", 0),
        ("", "length", 0),
    ],
)
def test_own_lead_reads_answers_and_cut_completions_and_skips_unanswered_ones(
    text: str, finish_reason: str, lead: int | None
) -> None:
    assert own_lead(text, finish_reason) == lead


def _own_round(texts: list[tuple[str, str]], family: str = "chain_sum") -> SharedRound:
    """One round of a node's own completions (text, finish reason) as calibrate reads it."""
    generated = [
        SimpleNamespace(
            item=SimpleNamespace(ref=SimpleNamespace(family=family)),
            result=SimpleNamespace(
                completions=[SimpleNamespace(logprobs=None, finish_reason=f) for _, f in texts]
            ),
        )
    ]
    local = [
        SimpleNamespace(
            completions=[SimpleNamespace(text=t, reward=float(RIGHT in t)) for t, _ in texts]
        )
    ]
    return SharedRound(0, generated, local, [], 0, 0.0, 0.0, 0.0)  # type: ignore[arg-type]


def test_the_tiny_models_untagged_answers_do_not_raise_the_floor_over_its_tagged_ones() -> None:
    # The README's default swarm (issue 23, 2026-12-05): over its first 12 rounds the tiny
    # model's 6,144 own completions were 96 % untagged bare answers (" 10" then EOS: leads
    # of 1 to 3 characters counted as all lead), 4 % tagged, and those mostly bare
    # (lead 0). Counted, the untagged ones set a floor of 0.5 to 1.5 and every honest peer's
    # rewarded bare answer was refused: 6.9 % of honest groups over 80 rounds, a third of
    # the learning. One node's first 8 rounds at B x L = 8 x 8:
    spec = DefenceSpec(plausibility=False, length_guard=False)
    calibration = Calibration(spec, max_new_tokens=16)
    untagged = [(f" {n % 90 + 10}", "stop") for n in range(60)]
    tagged = [(RIGHT, "stop"), (WRONG, "stop"), (" 7+3" + WRONG, "stop")]
    for _ in range(8):
        calibrate(calibration, _own_round([*untagged, *tagged, (" 1+2=3 and 4", "length")]))
    limits = calibration.thresholds()
    assert limits.limits("chain_sum").min_rewarded_lead == 0
    assert screen("chain_sum", [CompletionView([], 1.0, (), RIGHT)], limits) is None


def test_cut_completions_count_so_a_model_that_works_still_refuses_a_bare_answer() -> None:
    # SmolLM2 at 32 tokens (instruct prompt): most own completions are cut while working,
    # and the ones that close a tag within the cap are its shortest; counting only those
    # put the floor at 0 (the reverted mend, 94fa469). Counted as lower bounds, the cut
    # ones keep it where the model's work is.
    spec = DefenceSpec(plausibility=False, length_guard=False)
    calibration = Calibration(spec, max_new_tokens=32)
    own = [
        *[(" Let a be 5. 5 - 3 = 2, so we add the next", "length")] * 10,
        *[(" 2 + 3 = 5." + RIGHT, "stop")] * 4,
        *[(" 2 + 3 = 5.", "stop")] * 2,  # ended without answering: not counted
    ]
    calibrate(calibration, _own_round([*own, (RIGHT, "stop")]))  # one bare answer in 43
    calibrate(calibration, _own_round(own))
    calibrate(calibration, _own_round(own))
    limits = calibration.thresholds()
    assert limits.limits("chain_sum").min_rewarded_lead == 5  # 10 characters over 2
    assert screen("chain_sum", [CompletionView([], 1.0, (), RIGHT)], limits) == "too_brief"


def test_the_floor_waits_for_calibration_min_completions_and_eight_leads() -> None:
    spec = DefenceSpec(plausibility=False, length_guard=False, calibration_min=32)
    calibration = Calibration(spec, max_new_tokens=16)
    calibrate(calibration, _own_round([(RIGHT, "stop")] * 31))
    assert calibration.thresholds().limits("chain_sum").min_rewarded_lead is None
    calibration = Calibration(spec, max_new_tokens=16)
    calibrate(calibration, _own_round([(" 10", "stop")] * 40 + [(RIGHT, "stop")] * 7))
    assert calibration.thresholds().limits("chain_sum").min_rewarded_lead is None
    calibrate(calibration, _own_round([(RIGHT, "stop")]))
    assert calibration.thresholds().limits("chain_sum").min_rewarded_lead == 0


def test_a_family_without_its_own_floor_gets_the_pooled_one() -> None:
    # 12 own completions over three families: 4 each, none has 8, the pool has 12.
    limits = _calibration(["2 + 3 = 5."] * 12, ("chain_sum", "products", "base")).thresholds()
    assert limits.families["products"].min_rewarded_lead is None
    assert limits.limits("products").min_rewarded_lead == 5
    assert screen("products", [CompletionView([], 1.0, (), RIGHT)], limits) == "too_brief"


def test_on_by_default_and_calibration_without_text_is_not_counted() -> None:
    assert DefenceSpec().brevity_guard
    off = DefenceSpec(brevity_guard=False, calibration_min=1)
    cal = Calibration(off, max_new_tokens=48)
    cal.observe("chain_sum", [-0.5] * 8, 1.0, "2 + 3 = 5." + RIGHT)
    assert not cal.thresholds().brevity_guard
    assert cal.thresholds().limits("chain_sum").min_rewarded_lead is None
    on = Calibration(DefenceSpec(calibration_min=1), max_new_tokens=48)
    on.observe("chain_sum", [-0.5] * 8, 1.0)  # no text: nothing to measure
    assert on.thresholds().limits("chain_sum").min_rewarded_lead is None


def _scored(producer: str, texts: tuple[str, ...]) -> ScoredGroup:
    """Scored as this node's verifier would: 1 for the answer 5, wherever the work before it."""
    rewards = [1.0 if "<answer>5</answer>" in t else 0.0 for t in texts]
    return dataclasses.replace(
        scored_group(producer, texts),
        completions=tuple(
            ScoredCompletion(t, r, "stop") for t, r in zip(texts, rewards, strict=True)
        ),
    )


def _select(limits: Thresholds, pool: dict[str, tuple[str, ...]], round_: int) -> object:
    scored = {p: _scored(p, texts) for p, texts in pool.items()}
    fresh = tuple(
        BufferedGroup(
            SimpleNamespace(  # type: ignore[arg-type]
                producer=p,
                completions=[SimpleNamespace(text=t) for t in texts],
                task=SimpleNamespace(family="chain_sum"),
            ),
            bytes([n]) * 32,
            0.0,
        )
        for n, (p, texts) in enumerate(pool.items())
    )
    learner = fake_learner(lambda group: scored[group.producer])
    return select_one(learner, fresh, round_, limits=limits)


def test_the_attackers_cut_groups_are_dropped_and_the_honest_worked_one_is_trained() -> None:
    limits = _calibration(["2 + 3 = 5."] * 20).thresholds()
    pool = {"attacker1": TAILED, "honest": WORKED, "attacker2": TAILED}
    for round_ in range(10):
        choice = _select(limits, pool, round_)
        assert [c.producer for c in choice.external] == ["honest"]  # type: ignore[attr-defined]
        dropped = {(v.producer, v.reason) for v in choice.drops}  # type: ignore[attr-defined]
        assert dropped <= {("attacker1", "too_brief"), ("attacker2", "too_brief")}
    # An honest peer that answers bare where this node works is dropped too (the guard's
    # stated cost), and with the guard off the attackers' groups are drawn.
    choice = _select(limits, {"bare": BARE}, 0)
    assert [(v.producer, v.reason) for v in choice.drops] == [("bare", "too_brief")]  # type: ignore[attr-defined]
    off = _calibration([]).thresholds()
    drawn = {
        c.producer
        for r in range(20)
        for c in _select(off, pool, r).external  # type: ignore[attr-defined]
    }
    assert {"attacker1", "attacker2"} <= drawn


def test_the_filler_attackers_answer_passes_the_guard_and_its_payload_is_detected() -> None:
    # The guard's named gap (docs/security.md): a few characters of filler where the work
    # would be. The filler attack is that attacker; the guard's floor on SmolLM2 is a few
    # characters, and the filler is more, so only a measured run can say what it costs.
    import random

    from sapo_async.experiment.attack.filler import FILLER, Filler
    from sapo_async.experiment.attack.inject import Inject
    from tests.fixtures.fabric import make_account, make_group

    limits = _calibration(["2 + 3 = 5."] * 19 + ["5."]).thresholds()
    group = make_group(make_account(0))
    filler = Filler()
    forged = filler.forge(group, make_account(1), random.Random(0))[0].group.completions
    rewarded = [c.text for c in forged[::2]]
    assert all(answer_lead(t) == len(FILLER) for t in rewarded)
    views = [CompletionView([], 1.0, (), t) for t in rewarded]
    assert screen("chain_sum", views, limits) is None
    injected = Inject().forge(group, make_account(1), random.Random(0))[0].group.completions
    bare = CompletionView([], 1.0, (), injected[0].text.split("</answer>")[0] + "</answer>")
    assert screen("chain_sum", [bare], limits) == "too_brief"

    assert all(filler.carries_payload(t, group.answer) for t in rewarded)
    assert filler.carries_payload(" the  answer is:<answer>7</answer>", "7")
    assert not filler.carries_payload(" 2 + 3 = 5. The answer is <answer>5</answer>", "5")
    assert not filler.carries_payload(WRONG, "5")
    assert not filler.carries_payload(" The answer is", "5")
