"""The defences' pure policies: quarantine, calibration and screening."""

from __future__ import annotations

import pytest

from sapo_async.errors import ConfigError
from sapo_async.node.defence import (
    Calibration,
    CompletionView,
    repeated_span,
    screen,
)
from sapo_async.node.quarantine import Quarantine
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


def test_a_family_it_has_not_measured_gets_the_pooled_floor_and_no_length_limit() -> None:
    limits = _calibrated().thresholds()
    assert screen("arc_1d", [CompletionView([-9.0] * 10, 1.0)], limits) == "implausible"
    # Rewarded lengths differ between families: chain_sum's 5-7 tokens bound nothing else.
    assert screen("chain_sum", [CompletionView([-0.5] * 16, 1.0)], limits) == "too_long"
    assert screen("arc_1d", [CompletionView([-0.5] * 16, 1.0)], limits) is None


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


def _own_like_spread() -> Calibration:
    """Own completions as a sampled language model writes them: most tokens likely, a few
    (temperature 1 over a real vocabulary) unlikely."""
    cal = Calibration(DefenceSpec(calibration_min=8), max_new_tokens=32)
    for i in range(100):
        cal.observe("chain_sum", [-1.2 - 0.01 * (i % 10)] * 17 + [-6.0 - 0.1 * (i % 10)] * 3, 0.0)
    return cal


def test_screen_drops_a_payload_hidden_among_certain_tokens() -> None:
    """The inject attack on SmolLM2: the right answer (tokens near 0) plus a marker (a few
    tokens near -15) has a mean log-prob inside the node's own range; the mean of its least
    likely tokens is far below any own completion's."""
    limits = _own_like_spread().thresholds()
    payload = CompletionView([-0.1] * 12 + [-15.0, -13.0, -4.0], 1.0)
    mean_floor = limits.families["chain_sum"].min_mean_logprob
    assert mean_floor is not None
    assert sum(payload.logprobs) / 15 > mean_floor
    assert screen("chain_sum", [payload], limits) == "implausible"
    own_like = CompletionView([-1.25] * 17 + [-6.5] * 3, 1.0)
    assert screen("chain_sum", [own_like], limits) is None


@pytest.mark.parametrize("key", sorted(DefenceSpec.retired))
def test_a_retired_defence_setting_is_refused_in_one_line_saying_where_it_went(key: str) -> None:
    # Four were measured not to help; eight thresholds are fixed in code (limits.py).
    with pytest.raises(ConfigError) as caught:
        DefenceSpec(**{key: 1})
    message = str(caught.value)
    assert "\n" not in message
    assert f"{key} is no longer a setting" in message
    assert ("limits." + key.upper()) in message or "CHANGELOG.md" in message


def test_a_volunteer_has_at_most_fifteen_defence_settings() -> None:
    assert len(DefenceSpec.model_fields) <= 15
    assert not set(DefenceSpec.model_fields) & set(DefenceSpec.retired)


def test_low_mean_averages_the_least_likely_tokens() -> None:
    from sapo_async.node.defence import low_mean

    assert low_mean([-1.0, -9.0, -0.5, -3.0], 2) == -6.0
    assert low_mean([-2.0], 3) == -2.0


def test_only_a_calibrated_family_is_judged() -> None:
    """Peers' groups of a family the node has not calibrated wait (issue 23: SmolLM2's
    first four rounds trained on an attacker's payload unscreened)."""
    cal = Calibration(DefenceSpec(calibration_min=8), max_new_tokens=16)
    for _ in range(7):
        cal.observe("chain_sum", [-0.5] * 5, 0.0)
    assert not cal.thresholds().judges("chain_sum")
    assert not cal.thresholds().judges("arc_1d")
    cal.observe("chain_sum", [-0.5] * 5, 0.0)
    assert cal.thresholds().judges("chain_sum")
    off = Calibration(DefenceSpec(calibration_min=8, plausibility=False), max_new_tokens=16)
    assert off.thresholds().judges("chain_sum")


def test_mixed_families_are_judged_by_the_pooled_floor_until_each_is_calibrated() -> None:
    """With three families and 16 own completions a round (the SmolLM2 table, 30 rounds),
    each family alone needed about 6 rounds to calibrate, and its peers' groups waited that
    long; all own completions together reach calibration_min in 2. Until a family has its
    own floor, the pool's floor screens its groups."""
    cal = Calibration(DefenceSpec(calibration_min=8), max_new_tokens=16)
    families = ("chain_sum", "products", "basic_arithmetic")
    for i in range(7):
        cal.observe(families[i % 3], [-0.5] * 6, 0.0)
    assert not cal.thresholds().judges("products")  # 7 own completions in all: no pool yet
    cal.observe("chain_sum", [-0.5] * 6, 0.0)
    limits = cal.thresholds()
    assert all(limits.judges(f) for f in (*families, "arc_1d"))  # 8 in all; none has 8
    assert not limits.families["products"].min_mean_logprob  # not its own floor
    own_like = CompletionView([-0.55] * 6, 1.0)
    marker = CompletionView([-0.5] * 3 + [-8.0] * 3, 1.0)
    assert screen("products", [own_like], limits) is None
    assert screen("products", [own_like, marker], limits) == "implausible"
    # A family's own floor replaces the pool's once it has calibration_min completions.
    for _ in range(8):
        cal.observe("products", [-3.0] * 6, 0.0)
    limits = cal.thresholds()
    assert limits.families["products"].min_mean_logprob is not None
    assert screen("products", [CompletionView([-3.2] * 6, 1.0)], limits) is None
    assert screen("products", [CompletionView([-4.5] * 6, 1.0)], limits) == "implausible"
    off = Calibration(DefenceSpec(calibration_min=8, plausibility=False), max_new_tokens=16)
    for i in range(8):
        off.observe(families[i % 3], [-0.5] * 6, 0.0)
    assert off.thresholds().pooled is None


def test_a_short_payload_meets_the_floor_of_its_own_length_not_of_long_own_completions() -> None:
    """At 512-token completions the 3 least likely of an honest sample's tokens are far
    lower than those of a 13-token answer: one floor from whole own completions would admit
    the short payload; the floor is measured at the candidate's length."""
    import random

    from sapo_async.node.defence import length_buckets, low_mean

    rng = random.Random(3)
    cal = Calibration(DefenceSpec(calibration_min=32), max_new_tokens=512)
    for _ in range(200):  # temperature 1 over a real vocabulary: 1 token in 200 is a tail one
        own = [-16.0 + rng.random() if rng.random() < 0.005 else -1.2 for _ in range(512)]
        cal.observe("chain_sum", own, 0.0)
    limits = cal.thresholds()
    family = limits.families["chain_sum"]
    assert [b for b, _ in family.low_floors] == list(length_buckets(513))
    payload = [-0.1] * 10 + [-17.0, -13.0, -12.0]
    whole = family.low_floor(512)
    assert whole is not None
    assert low_mean(payload, 3) > whole  # what a single floor would have admitted
    assert screen("chain_sum", [CompletionView(payload, 1.0)], limits) == "implausible"
    assert screen("chain_sum", [CompletionView([-1.2] * 12 + [-6.0], 1.0)], limits) is None


def test_length_buckets_reach_the_cap() -> None:
    from sapo_async.node.defence import length_buckets

    assert length_buckets(33) == (8, 16, 32, 64)
    assert length_buckets(8) == (8,)


def test_repeated_span_counts_the_tokens_a_short_pattern_covers() -> None:
    assert repeated_span([]) == 0
    assert repeated_span([1, 2, 3, 4, 5]) == 0
    assert repeated_span([7] * 10) == 10
    assert repeated_span([1, 2] + [5, 6] * 6 + [3]) == 12  # a two-token pattern, six times
    assert repeated_span([9, 1, 2, 3, 4, 1, 2, 3, 4, 8]) == 8  # period 4
    assert repeated_span([1, 2, 3, 4, 5] * 3) == 0  # period 5: beyond the patterns looked for
    assert repeated_span([1, 2, 3, 4, 5] * 3, max_period=5) == 15


def test_screen_drops_a_rewarded_completion_padded_with_a_repeated_pattern() -> None:
    limits = Calibration(DefenceSpec(repetition_limit=12), max_new_tokens=32).thresholds()
    answer = [40, 41, 42, 43]
    padded = CompletionView([], 1.0, [17, 18] * 6 + answer)  # " ." x 6 in pairs of tokens
    short_pad = CompletionView([], 1.0, [17, 18] * 5 + answer)
    honest = CompletionView([], 1.0, [3, 1, 4, 1, 5, 9, 2, 6, *answer])
    assert screen("chain_sum", [honest, short_pad], limits) is None
    assert screen("chain_sum", [honest, padded], limits) == "repetitive"
    off = Calibration(DefenceSpec(repetition_limit=0), max_new_tokens=32).thresholds()
    assert screen("chain_sum", [padded], off) is None


def test_the_length_guard_refuses_a_rewarded_completion_that_never_stopped() -> None:
    """The capped attack (Reliquary's cap-path forcing): work run to the cap, the right
    answer last, no stop token. Pushing it up teaches writing to the cap; a rewarded
    completion that never stopped is refused, whatever its length, and only by the
    length guard; one pushed down is never screened, so an unrewarded one passes."""
    from sapo_async.node.defence import Thresholds
    from sapo_async.wire.reasons import RejectReason

    lps = [-0.5] * 32
    unstopped = CompletionView(lps, 1.0, stopped=False)
    guarded = Thresholds({}, max_tokens=33, plausibility=False, length_guard=True)
    assert screen("chain_sum", [unstopped], guarded) is RejectReason.TOO_LONG
    assert screen("chain_sum", [CompletionView(lps, 1.0)], guarded) is None
    assert screen("chain_sum", [CompletionView(lps, 0.0, stopped=False)], guarded) is None
    off = Thresholds({}, max_tokens=33, plausibility=False, length_guard=False)
    assert screen("chain_sum", [unstopped], off) is None


def test_a_same_model_peer_is_judged_by_its_token_test_not_the_floors() -> None:
    # Issue 57: the per-token test's p-value decides for a peer of the node's own model,
    # uncalibrated or not; the calibrated floors judge only another model's completions.
    uncalibrated = Calibration(DefenceSpec(), max_new_tokens=16).thresholds()
    calibrated = _calibrated().thresholds()
    unlikely = [-0.5] * 3 + [-8.0] * 3  # below the calibrated floors
    for limits in (uncalibrated, calibrated):
        assert screen("chain_sum", [CompletionView(unlikely, 1.0, p_value=0.5)], limits) is None
        refused = screen("chain_sum", [CompletionView([-0.5] * 6, 1.0, p_value=1e-4)], limits)
        assert refused == "implausible"
    assert screen("chain_sum", [CompletionView(unlikely, 1.0)], calibrated) == "implausible"
