"""The attack summary reads each attack by its kind in spec.py (a length ratio, a CPU ratio
or a payload rate), and checks the goals over the tuning and held-out sets apart."""

from __future__ import annotations

import pytest

from sapo_async.experiment.attack import summary as summary_module
from sapo_async.experiment.attack.spec import (
    ATTACKS,
    HELD_OUT_ATTACKS,
    KNOWN_ATTACKS,
    LENGTH_ATTACKS,
    LITERATURE_ATTACKS,
    RATIO_ATTACKS,
    AttackSpec,
    RunMeasure,
)
from sapo_async.experiment.attack.summary import TARGETS, markdown_table, measure_of, summarise

ROUNDS = 5


def _run(
    attack: str,
    on: bool,
    *,
    seed: int = 0,
    length: float = 10.0,
    payload: float = 0.0,
    cpu: float = 1.0,
    reward: float = 0.5,
) -> RunMeasure:
    honest = [0, 1] if attack != "none" else [0, 1, 2, 3]
    return RunMeasure(
        attack,
        on,
        seed,
        "1/1",
        honest,
        rewards=[[reward] * ROUNDS] * 4,
        payload=[payload] * ROUNDS,
        length=[length] * ROUNDS,
        round_cpu_s=[cpu] * ROUNDS,
        round_s=[cpu] * ROUNDS,
    )


def test_every_attack_has_the_measure_its_kind_in_spec_names():
    assert {"flood", "absurd"} == RATIO_ATTACKS - LENGTH_ATTACKS  # the CPU ratios
    assert {"length", "longest", "capped"} == LENGTH_ATTACKS
    for attack in KNOWN_ATTACKS:
        expected = (
            "length"
            if attack in LENGTH_ATTACKS
            else "cpu"
            if attack in RATIO_ATTACKS
            else "payload"
        )
        assert measure_of(attack) == expected, attack


def test_longest_and_capped_are_scored_as_the_length_ratio_not_their_payload_detector():
    # Their detectors are always False: read as a payload rate they scored 0.000 whatever
    # they did to the honest nodes' completion length.
    spec = AttackSpec(
        attacks=("capped", "longest", "inject"),
        seeds=(0,),
        nodes=4,
        attackers=2,
        rounds=ROUNDS,
        local=1,
        external=1,
    )
    runs = [
        _run("none", False),
        _run("none", True),
        _run("capped", False, length=20.0),
        _run("capped", True, length=11.0),
        _run("longest", False, length=15.0),
        _run("longest", True, length=13.0),
        _run("inject", False, payload=0.5),
        _run("inject", True),
    ]
    summary = summarise(spec, runs, seconds=0.0)
    capped = summary["attacks"]["capped"]
    assert capped["asr_off"] == pytest.approx(2.0)
    assert capped["asr_on"] == pytest.approx(1.1)
    assert capped["asr_kind"].startswith("honest mean completion length")
    assert "cpu_ratio_on" not in capped  # a length ratio, not a CPU one
    assert summary["attacks"]["longest"]["asr_on"] == pytest.approx(1.3)
    assert summary["defended"]["capped"]["asr_on"] == pytest.approx(1.1)
    assert summary["attacks"]["inject"]["asr_off"] == pytest.approx(0.5)  # unchanged
    table = markdown_table(summary)
    assert "| `capped` | length / no-attack | 2.000 | 1.100 | <= 1.2 (met) |" in table
    assert "| `longest` | length / no-attack | 1.500 | 1.300 | <= 1.2 (missed) |" in table
    # The figure's trace: per round, length over the no-attack run's (not CPU over CPU).
    trace = summary_module._trace("capped", runs[2], runs, "1/1")
    assert trace == pytest.approx([2.0] * ROUNDS)


def test_targets_keep_the_recorded_attacks_bounds_and_cover_the_new_ones():
    assert {a: TARGETS[a] for a in ("inject", "tokens", "length", "flood", "absurd")} == {
        "inject": 0.05,
        "tokens": 0.05,
        "length": 1.2,
        "flood": 1.2,
        "absurd": 1.2,
    }
    assert "wrong" not in TARGETS  # a control
    assert TARGETS["longest"] == TARGETS["capped"] == 1.2
    for attack in ("filler", "trigger", "stock_leads", "post_selected", "sybil", *HELD_OUT_ATTACKS):
        assert TARGETS[attack] == 0.05, attack


def test_the_goals_are_checked_over_the_tuning_and_held_out_sets_apart():
    spec = AttackSpec(
        attacks=("inject", "capped", "sleeper"),
        seeds=(0, 1),
        nodes=4,
        attackers=2,
        rounds=ROUNDS,
        local=1,
        external=1,
    )
    runs = []  # a defended-only matrix: no attack and each attack, the defences on
    for seed in (0, 1):
        runs += [
            _run("none", True, seed=seed),
            _run("inject", True, seed=seed),
            _run("capped", True, seed=seed, length=11.0),
            _run("sleeper", True, seed=seed, payload=0.3),
        ]
    runs[0].honest_groups_judged, runs[0].honest_groups_dropped = 200, 1
    summary = summarise(spec, runs, seconds=0.0)
    sets = summary["sets"]
    assert list(sets["tuning"]["attacks"]) == ["inject", "capped"]
    assert list(sets["held_out"]["attacks"]) == ["sleeper"]
    assert sets["tuning"]["verdict"] == "met"
    sleeper = sets["held_out"]["attacks"]["sleeper"]
    assert (sleeper["asr_on"], sleeper["asr_on_target"]) == (pytest.approx(0.3), 0.05)
    assert sleeper["asr_on_verdict"] == "missed"
    assert sleeper["honest_reward_ratio_on_same_verdict"] == "met"
    assert sets["held_out"]["verdict"] == "missed"
    assert sets["false_positives"] == {"rate": 0.0025, "goal": 0.01, "verdict": "met"}
    table = markdown_table(summary)
    assert "Tuning set (`inject`, `capped`): met." in table
    assert "Held-out set (`sleeper`): missed (`sleeper` measure 0.300 missed, reward 1.00 met)" in (
        table
    )
    assert "False positives with no attack 0.0025 (at most 0.01): met." in table
    # A matrix of tuning attacks alone has no held-out set.
    tuned = AttackSpec(
        attacks=("inject",), seeds=(0, 1), nodes=4, attackers=2, rounds=ROUNDS, local=1, external=1
    )
    assert "held_out" not in summarise(tuned, runs, seconds=0.0)["sets"]
    assert "Held-out set" not in markdown_table(summarise(tuned, runs, seconds=0.0))


def test_a_control_has_no_target_and_an_unmeasured_set_no_line():
    spec = AttackSpec(attacks=("wrong",), seeds=(0,), nodes=4, attackers=2, local=1, external=1)
    runs = [_run("none", True), _run("wrong", True, payload=0.5)]
    row = summarise(spec, runs, seconds=0.0)["sets"]["tuning"]["attacks"]["wrong"]
    assert (row["asr_on_target"], row["asr_on_verdict"]) == (None, None)
    assert row["verdict"] == "undecided"  # one seed: the reward goal is undecided
    empty = summarise(spec, [], seconds=0.0)
    assert set(empty["sets"]) == {"false_positives"}
    assert "Goals with the defences on, by set" not in markdown_table(empty)


def test_the_cli_help_names_every_attack_and_which_run_only_when_named():
    from typer.testing import CliRunner

    from sapo_async.cli import attack as cli_attack
    from sapo_async.cli.main import build_app

    text = cli_attack._ATTACKS
    default, _, named = text.partition("; by name only: ")
    assert default == "all: " + ", ".join(ATTACKS)
    for attack in LITERATURE_ATTACKS:
        assert attack in named, attack
    assert "the held-out " + ", ".join(HELD_OUT_ATTACKS) in named
    result = CliRunner().invoke(build_app(), ["experiment", "attack", "--help"])
    assert result.exit_code == 0, result.output
    assert "sleeper" in result.output
