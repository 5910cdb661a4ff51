"""The defences' pure policies: quarantine, admission bounds, calibration and screening."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from sapo_async.errors import RejectedInput
from sapo_async.node.defence import (
    AdmissionBounds,
    Calibration,
    CompletionView,
    Quarantine,
    screen,
)
from sapo_async.node.spec import DefenceSpec
from sapo_async.tasks.source import TaskSource, dataset_seed
from sapo_async.tasks.spec import CPU_PRESET, canonical_config_json, config_digest
from sapo_async.wire import TaskRef
from tests.fixtures.fabric import make_account, make_group

PEER = make_account(1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_quarantine_starts_at_the_drop_rate_and_ends_after_its_duration() -> None:
    clock = Clock()
    q = Quarantine(0.5, 4, 60.0, clock=clock)
    assert not any(q.record("a", dropped) for dropped in (False, False, True))
    assert q.record("a", True)  # 2 of 4
    assert q.blocked("a")
    assert q.active() == ["a"]
    assert not q.blocked("b")
    clock.now += 61
    assert not q.blocked("a")
    assert q.active() == []


def test_quarantine_spares_a_producer_below_the_rate() -> None:
    q = Quarantine(0.5, 4, 60.0, clock=Clock())
    for i in range(40):
        q.record("honest", i % 4 == 0)  # a quarter dropped
    assert not q.blocked("honest")
    assert q.entered == 0


def _own_group(index: int = 0):  # type: ignore[no-untyped-def]
    item = TaskSource(CPU_PRESET, swarm_seed=3).round_items(1, 0, 1)[0]
    return replace(
        make_group(PEER, index=index),
        task=item.ref,
        task_config=item.config_json,
        question=item.question,
        answer=item.answer,
    )


def test_admission_takes_own_preset_and_refuses_other_configs_seeds_and_sizes() -> None:
    verdicts: list[tuple[str, bool]] = []
    bounds = AdmissionBounds(
        DefenceSpec(max_prompt_chars=100, max_completion_chars=50),
        CPU_PRESET,
        dataset_seed(3),
        on_verdict=lambda p, d: verdicts.append((p, d)),
    )
    good = _own_group()
    bounds(good)
    config = canonical_config_json({"min_terms": 8000, "max_terms": 8000})
    absurd = replace(
        good,
        task=TaskRef(good.task.family, config_digest(config), good.task.seed, 0),
        task_config=config,
    )
    other_seed = replace(good, task=replace(good.task, seed=dataset_seed(4)))
    cases = {
        "task_outside_preset": [absurd, other_seed],
        "prompt_too_long": [replace(good, question="1 + " * 40)],
        "completion_too_long": [make_group(PEER, text="x" * 60)],
    }
    for reason, groups in cases.items():
        for g in groups:
            case = g
            if reason == "completion_too_long":
                case = replace(g, task=good.task, task_config=good.task_config)
            with pytest.raises(RejectedInput) as info:
                bounds(case)
            assert info.value.reason == reason
    assert verdicts == [(PEER.address, True)] * 4


def test_admission_caps_groups_per_producer_round() -> None:
    bounds = AdmissionBounds(DefenceSpec(max_groups_per_producer_round=3), CPU_PRESET, 0)
    item = TaskSource(CPU_PRESET).round_items(1, 0, 1)[0]
    group = replace(
        make_group(PEER), task=item.ref, task_config=item.config_json, question=item.question
    )
    for _ in range(3):
        bounds(group)
    with pytest.raises(RejectedInput, match="producer_round_flood"):
        bounds(group)
    bounds(replace(group, producer_round=1))  # a new round starts a new count


def _calibrated(**kw: object) -> Calibration:
    cal = Calibration(DefenceSpec(calibration_min=8, **kw), max_new_tokens=16)  # type: ignore[arg-type]
    for i in range(100):
        # Own completions: mean log-prob about -0.5, rewarded ones 5 to 7 tokens long.
        cal.observe("chain_sum", [-0.5 - 0.01 * (i % 10)] * (5 + i % 3), 1.0 if i % 2 else 0.0)
    return cal


def test_screen_drops_an_implausible_completion_and_keeps_own_like_ones() -> None:
    limits = _calibrated().thresholds()
    own_like = [CompletionView([-0.55] * 6, 1.0), CompletionView([-0.6] * 5, 0.0)]
    assert screen("chain_sum", own_like, limits) is None
    marker = [*own_like, CompletionView([-0.5] * 3 + [-8.0] * 3, 1.0)]
    assert screen("chain_sum", marker, limits) == "implausible"


def test_screen_drops_needlessly_long_rewarded_completions_but_not_long_wrong_ones() -> None:
    limits = _calibrated().thresholds()
    assert screen("chain_sum", [CompletionView([-0.5] * 16, 1.0)], limits) == "too_long"
    assert screen("chain_sum", [CompletionView([-0.5] * 10, 0.0)], limits) is None
    assert screen("chain_sum", [CompletionView([-0.5] * 18, 0.0)], limits) == "too_long"


def test_screen_applies_nothing_calibrated_to_a_family_it_has_not_measured() -> None:
    limits = _calibrated().thresholds()
    assert screen("arc_1d", [CompletionView([-9.0] * 10, 1.0)], limits) is None


def test_switched_off_checks_do_not_drop() -> None:
    limits = _calibrated(plausibility=False, length_guard=False).thresholds()
    assert not limits.needs_logprobs
    assert screen("chain_sum", [CompletionView([-9.0] * 30, 1.0)], limits) is None
