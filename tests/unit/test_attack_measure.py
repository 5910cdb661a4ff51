"""The attack experiment's round measure counts the whole round, and its summary uses it.

A flood costs the honest collectors while the attackers publish (one event loop), so a
measure that subtracts the attackers' publish time undercounts it (issue 23)."""

from __future__ import annotations

import json
import os
import random

import pytest

from sapo_async.errors import ConfigError
from sapo_async.experiment.attack.length import Length
from sapo_async.experiment.attack.measure import RoundClock, process_cpu_s
from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure
from sapo_async.experiment.attack.summary import markdown_table, slope, summarise
from sapo_async.experiment.attack.tokens import Tokens
from tests.fixtures.fabric import make_account, make_group


class _Clock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_round_clock_counts_cpu_spent_during_the_attackers_steps():
    cpu, wall, server = _Clock(), _Clock(), _Clock()
    clock = RoundClock(cpu=cpu, wall=wall, server=server)
    clock.start()
    cpu.now += 0.5  # honest share
    with clock.attacker():
        cpu.now += 2.0  # the attacker publishes; honest collectors ingest meanwhile
        wall.now += 1.0
    server.now += 0.25
    times = clock.stop()
    assert times.cpu_s == pytest.approx(2.5)
    assert times.cpu_without_attackers_s == pytest.approx(0.5)
    assert times.wall_without_attackers_s == pytest.approx(0.0)
    assert times.wall_s == pytest.approx(1.0)
    assert times.server_cpu_s == pytest.approx(0.25)


def test_round_clock_charges_each_collectors_ingest_to_its_own_node():
    # In one process the attackers' forging and signing are counted in the round's CPU;
    # the tiny flood read 3.7x that way over the in-memory transport (issue 23).
    cpu = _Clock()
    clock = RoundClock(cpu=cpu, wall=_Clock())

    def ingest(cost: float) -> float:
        cpu.now += cost
        return cost

    honest_ingest = clock.collector(ingest, honest=True)
    attacker_ingest = clock.collector(ingest, honest=False)
    clock.start()
    cpu.now += 1.0  # an honest node's own share
    honest_ingest(0.25)  # outside the attackers' steps: already the honest nodes'
    with clock.attacker():
        cpu.now += 3.0  # the attacker forges and signs its copies
        assert honest_ingest(0.5) == 0.5  # honest collectors ingest them meanwhile
        attacker_ingest(0.125)  # inside its own step: already the attacker's
    attacker_ingest(0.75)  # an attacker's collector outside its step: not honest work
    times = clock.stop()
    assert times.cpu_s == pytest.approx(5.625)
    assert times.cpu_without_attackers_s == pytest.approx(2.0)
    assert times.cpu_honest_s == pytest.approx(1.0 + 0.25 + 0.5)


def test_round_clock_without_a_server_records_no_server_cpu():
    clock = RoundClock()
    clock.start()
    assert clock.stop().server_cpu_s is None


def test_process_cpu_reads_this_process_and_nothing_for_a_missing_one():
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("no /proc on this system")
    mine = process_cpu_s(os.getpid())
    assert mine is not None
    assert mine > 0
    assert process_cpu_s(2**22 + 1) is None  # above Linux's pid_max


def _run(attack: str, defences: bool, cpu: list[float], old: list[float]) -> RunMeasure:
    m = RunMeasure(attack, defences, 0, "1/1", [0, 1], rewards=[[1.0, 1.0]] * 3)
    m.round_cpu_s, m.round_s = cpu, old
    m.payload = [0.0, 0.5] if attack == "inject" else [0.0, 0.0]
    return m


def test_flood_measure_is_the_whole_round_cpu_against_the_no_attack_run():
    spec = AttackSpec(
        attacks=("flood", "inject"), seeds=(0,), nodes=3, attackers=1, rounds=2, local=1, external=1
    )
    runs = [
        _run("none", False, [1.0, 1.0], [1.0, 1.0]),
        _run("none", True, [1.0, 1.0], [1.0, 1.0]),
        _run("flood", False, [3.0, 3.0], [0.8, 0.8]),  # old measure: cheaper than no attack
        _run("flood", True, [1.5, 1.5], [0.9, 0.9]),
        _run("inject", False, [1.0, 1.0], [1.0, 1.0]),
        _run("inject", True, [1.0, 1.0], [1.0, 1.0]),
    ]
    summary = summarise(spec, runs, seconds=1.0)
    flood = summary["attacks"]["flood"]
    assert flood["asr_off"] == pytest.approx(3.0)
    assert flood["asr_on"] == pytest.approx(1.5)
    assert flood["cpu_ratio_off"] == pytest.approx(3.0)
    assert flood["round_s_ratio_off"] == pytest.approx(0.8)
    inject = summary["attacks"]["inject"]
    assert inject["payload_by_round_off"] == [0.0, 0.5]
    assert inject["payload_slope_off"] == pytest.approx(0.5)
    assert inject["payload_last_half_off"] > inject["payload_first_half_off"]
    assert summary["model"] == "tiny"
    assert summary["model_sha256"] is None
    assert summary["sizes"]["nodes"] == 3


def test_the_honest_cpu_measure_is_per_honest_node():
    """The no-attack run has every node honest, an attack run only ``nodes - attackers``:
    the honest nodes' own CPU compared whole read 0.47x for a SmolLM2 flood (2 honest nodes
    against 4) and 1.20x for the tiny one (6 against 8) where each honest node spent 0.94x
    and 1.60x of its no-attack CPU."""
    spec = AttackSpec(attacks=("flood",), seeds=(0,), nodes=4, attackers=2, rounds=2)
    runs = []
    for attack, defences, honest, per_node in [
        ("none", False, [0, 1, 2, 3], 1.0),
        ("none", True, [0, 1, 2, 3], 1.0),
        ("flood", False, [0, 1], 1.5),
        ("flood", True, [0, 1], 1.1),
    ]:
        m = RunMeasure(attack, defences, 0, "2/2", honest, rewards=[[1.0, 1.0]] * len(honest))
        m.round_cpu_s = m.round_s = [4.0, 4.0]
        m.round_cpu_honest_s = [per_node * len(honest)] * 2
        m.payload = [0.0, 0.0]
        runs.append(m)
    flood = summarise(spec, runs, seconds=1.0)["attacks"]["flood"]
    assert flood["honest_cpu_ratio_off"] == pytest.approx(1.5)
    assert flood["honest_cpu_ratio_on"] == pytest.approx(1.1)


def test_slope_of_a_line_is_its_gradient():
    assert slope([1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert slope([4.0]) == 0.0


def test_tiny_length_pad_is_unchanged_spaces():
    assert Length(16).padded("17") == " " * 10 + "<answer>17</answer>"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "gpt-5"}, "model"),
        ({"transport": "carrier-pigeon"}, "transport"),
        ({"attackers": 8}, "attackers"),
        ({"tasks": "hard"}, "tasks"),
        ({"attacks": ("bribe",)}, "attacks"),
        ({"train_layers": 0}, "train_layers"),
        ({"eval_questions": -1}, "eval_questions"),
        ({"eval_completions": 0}, "eval_completions"),
    ],
)
def test_attack_spec_refuses_a_bad_value_naming_the_field(change, field):
    with pytest.raises(ConfigError) as info:
        AttackSpec(**change)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_recorded_runs_survive_a_matrix_that_asks_for_more_attacks_or_seeds(tmp_path):
    # The real-model matrix accumulates across sittings: inject first, the rest later.
    from dataclasses import asdict, replace

    from sapo_async.experiment.attack.record import load_runs
    from sapo_async.node.spec import DefenceSpec

    path = tmp_path / "runs.jsonl"
    first = AttackSpec(attacks=("inject",), seeds=(0,), rounds=5)
    assert load_runs(path, first) == []
    run = RunMeasure("inject", False, 0, "1/1", [0, 1], payload=[0.0, 0.5])
    with path.open("a") as f:
        f.write(json.dumps(asdict(run)) + "\n")
    grown = replace(first, attacks=("inject", "tokens"), seeds=(0, 1))
    assert load_runs(path, grown) == [run]
    assert load_runs(path, grown) == [run]  # rewriting the header kept the run
    # A field added to the spec after the runs were recorded counts as its default, and so
    # does a defence setting the node spec gained.
    lines = path.read_text().splitlines()
    old_header = json.loads(lines[0])
    del old_header["spec"]["eval_questions"]
    del old_header["spec"]["defence"]["quarantine_s"]
    path.write_text("\n".join([json.dumps(old_header), *lines[1:]]) + "\n")
    assert load_runs(path, grown) == [run]
    other = replace(grown, defence=DefenceSpec(cut_after_answer=False))
    assert load_runs(path, other) == []  # another node defence: a fresh file
    kept = tmp_path / "runs.jsonl.1"  # ... and the recorded runs kept beside it, not lost
    assert json.loads(kept.read_text().splitlines()[1]) == asdict(run)


def test_honest_reward_is_also_compared_with_the_same_nodes_sharing_nothing():
    spec = AttackSpec(
        attacks=("inject",), seeds=(0,), nodes=3, attackers=1, rounds=2, local=1, external=1
    )

    def run(attack: str, defences: bool, reward: float, config: str = "1/1") -> RunMeasure:
        m = RunMeasure(attack, defences, 0, config, [0, 1], rewards=[[reward] * 2] * 3)
        m.round_cpu_s = m.round_s = [1.0, 1.0]
        m.payload = [0.0, 0.0]
        return m

    runs = [
        run("none", False, 2.0),
        run("none", True, 1.25),
        run("none", False, 0.5, "2/0"),
        run("inject", False, 0.25),
        run("inject", True, 1.0),
    ]
    inject = summarise(spec, runs, seconds=1.0)["attacks"]["inject"]
    assert inject["honest_reward_ratio_on"] == pytest.approx(0.5)
    # Against the no-attack run with the same defences: the attack's own cost.
    assert inject["honest_reward_ratio_on_same"] == pytest.approx(0.8)
    assert inject["honest_reward_ratio_on_solo"] == pytest.approx(2.0)
    assert inject["honest_reward_ratio_off_solo"] == pytest.approx(0.5)
    assert "payload_no_attack_on" not in inject  # runs recorded before the floor existed
    runs[1].payload_base = {"inject": [0.0, 0.25]}
    floored = summarise(spec, runs, seconds=1.0)
    assert floored["attacks"]["inject"]["payload_no_attack_on"] == pytest.approx(0.25)
    assert "(no attack 0.250)" in markdown_table(floored)
    assert "| 0.50 | 0.80 | 0.12 | 2.00 |" in markdown_table(summarise(spec, runs, seconds=1.0))
    # Without the no-sharing run the comparison is left out, not made up.
    partial = summarise(spec, runs[:2] + runs[3:], seconds=1.0)["attacks"]["inject"]
    assert "honest_reward_ratio_on_solo" not in partial


@pytest.mark.parametrize(
    ("text", "payload"),
    [
        (" <answer>7</answer> 3(/.=", True),  # what the attack sends
        (" <answer>7</answer>\n 12 + 9 =", True),  # its alphabet, spaced out
        (" <answer>7</answer>", False),
        (" <answer>7</answer>  ", False),
        (" <answer>7</answer> 3.", False),  # shorter than any run the attack sends
        # Honest text after the tag (the old detector, "anything after the tag", counted
        # these: 0.031 of honest SmolLM2 completions with no attack, issue 23).
        (" <answer>7</answer>\nThe answer is 7.", False),
        (" <answer>7</answer> because 3+4=7", False),
        (" 3+4=7 so 7", False),  # no closing tag
    ],
)
def test_the_tokens_detector_counts_the_attacks_alphabet_run_not_any_text_after_the_tag(
    text, payload
):
    assert Tokens().carries_payload(text, "7") is payload


def test_every_forged_tokens_completion_with_the_right_answer_is_detected():
    account = make_account(0)
    group = make_group(account, completions=8)  # its answer is "4"
    rng = random.Random(0)
    for _ in range(50):
        (forged,) = Tokens().forge(group, account, rng)
        texts = [c.text for c in forged.group.completions]
        assert [Tokens().carries_payload(t, group.answer) for t in texts] == [True, False] * 4


def test_recorded_summarises_every_attack_over_the_seeds_it_has_and_runs_nothing(
    tmp_path, monkeypatch
):
    # inject measured on three seeds, flood on one: --recorded summarises both from
    # runs.jsonl, each over its own seeds, without starting a run.
    from dataclasses import asdict

    from typer.testing import CliRunner

    from sapo_async.cli.main import build_app
    from sapo_async.experiment.attack import runner

    def refuse(*args, **kwargs):
        raise AssertionError("--recorded started a run")

    monkeypatch.setattr(runner, "run_one", refuse)
    sizes = ["--nodes", "3", "--attackers", "1", "--rounds", "2", "--local", "1"]
    sizes += ["--external", "1", "--transport", "memory"]
    spec = AttackSpec(
        attacks=("inject", "flood"),
        seeds=(0, 1, 2),
        nodes=3,
        attackers=1,
        rounds=2,
        local=1,
        external=1,
        transport="memory",
    )
    runs = []
    for seed in (0, 1, 2):
        for attack in ("none", "inject") + (("flood",) if seed == 0 else ()):
            for on in (False, True):
                m = RunMeasure(attack, on, seed, "1/1", [0, 1], rewards=[[1.0, 1.0]] * 3)
                m.round_cpu_s = m.round_s = [1.0, 1.0]
                m.payload = [0.0, 1.0 if attack == "inject" and not on else 0.0]
                m.seconds = 10.0
                runs.append(m)
    (tmp_path / "runs.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in [{"spec": spec.record()}, *map(asdict, runs)])
    )
    args = ["experiment", "attack", *sizes, "--attacks", "inject,flood", "--seeds", "3"]
    result = CliRunner().invoke(build_app(), [*args, "--out", str(tmp_path), "--recorded"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(summary["attacks"]["inject"]["seeds"]) == ["0", "1", "2"]
    assert sorted(summary["attacks"]["flood"]["seeds"]) == ["0"]
    assert summary["attacks"]["inject"]["asr_off"] == pytest.approx(1.0)  # its last round
    assert summary["run_seconds"] == pytest.approx(10.0 * len(runs))
    # Every run earned the same: the interval over the three seeds is the mean itself.
    goal = summary["attacks"]["inject"]["honest_reward_ratio_on_goal"]
    assert (goal["verdict"], goal["seeds"], goal["ci95"]) == ("met", 3, [1.0, 1.0])
    assert "`inject` 1.00 [1.00, 1.00] over 3 seeds: met" in (tmp_path / "summary.md").read_text()
    # Runs recorded before environments were kept are listed as such, not passed as one.
    assert summary["environments"]["same"] is False
    assert len(summary["environments"]["unrecorded"]) == len(runs)
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 1 + len(runs)
