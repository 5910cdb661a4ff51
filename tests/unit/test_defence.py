"""The defences' pure policies: quarantine, calibration and screening."""

from __future__ import annotations

from sapo_async.node.defence import (
    Calibration,
    CompletionView,
    Quarantine,
    screen,
)
from sapo_async.node.spec import DefenceSpec
from tests.fixtures.fabric import make_account

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
    # Over the node's own cap is the round's size bound (completion_too_many_tokens, checked
    # on the candidate view before any log-prob), not the length guard's.
    assert screen("chain_sum", [CompletionView([-0.5] * 18, 0.0)], limits) is None


def test_screen_applies_nothing_calibrated_to_a_family_it_has_not_measured() -> None:
    limits = _calibrated().thresholds()
    assert screen("arc_1d", [CompletionView([-9.0] * 10, 1.0)], limits) is None


def test_switched_off_checks_do_not_drop() -> None:
    limits = _calibrated(plausibility=False, length_guard=False).thresholds()
    assert not limits.needs_logprobs
    assert screen("chain_sum", [CompletionView([-9.0] * 30, 1.0)], limits) is None


def test_the_size_bound_allows_a_foreign_tokenizer_its_slack() -> None:
    """Honest Gemma text at its 24-token budget was 26 to 38 SmolLM2 tokens
    (bench/results/defence_fp.json): the exact bound dropped every such group; a peer with
    another tokenizer gets FOREIGN_TOKEN_SLACK times the cap, a same-tokenizer peer none."""
    from sapo_async.limits import FOREIGN_TOKEN_SLACK
    from sapo_async.node.defence import Thresholds
    from sapo_async.node.selection import size_bound

    limits = Thresholds({}, max_tokens=25, plausibility=True, length_guard=True)
    assert size_bound(limits, same_tokenizer=True) == 25
    assert size_bound(limits, same_tokenizer=False) == 50 == 25 * FOREIGN_TOKEN_SLACK
    assert size_bound(limits, same_tokenizer=False) >= 38
