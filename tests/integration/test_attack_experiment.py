"""The attack experiment's quick mode runs real nodes under attack over a private
nats-server and writes its outputs beside, never over, the recorded results; a packaged
real model runs the same harness."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.experiment.attack.inject import MARKER, Inject
from sapo_async.experiment.attack.length import Length
from sapo_async.experiment.attack.runner import AttackSpec, run_one
from sapo_async.experiment.attack.tokens import Tokens
from sapo_async.node.defence import repeated_span
from sapo_async.node.spec import DefenceSpec

pytestmark = [pytest.mark.slow]


@pytest.mark.nats
@pytest.mark.timeout(900)
def test_attack_quick_measures_each_attack_with_defences_off_and_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output directories are relative
    result = CliRunner().invoke(
        build_app(),
        [
            "experiment",
            "attack",
            "--quick",
            "--attacks",
            "inject,absurd",
            "--eval-questions",
            "2",
            "--eval-completions",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "docs").exists()
    out = tmp_path / "runs" / "attack-quick"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["attacks"]) == {"inject", "absurd"}
    for row in summary["attacks"].values():
        for key in ("asr_off", "asr_on", "honest_reward_ratio_on"):
            assert row[key] >= 0.0
    assert 0.0 <= summary["false_positive_rate"] <= 1.0
    assert summary["sharing_gain_on"] > 0
    assert summary["sharing_gain_off"] > 0
    runs = json.loads((out / "runs.json").read_text())
    # none off/on, 4/0, each attack off/on, and the 3 honest nodes alone off/on (the
    # defended one is what the reward goal is read over): 3 + 2 x 2 + 2 runs of 3 rounds.
    assert len(runs) == 9
    alone = [r for r in runs if r["config"] == "1/1@3"]
    assert [(r["attack"], r["defences"], r["honest"]) for r in alone] == [
        ("none", False, [0, 1, 2]),
        ("none", True, [0, 1, 2]),
    ]
    assert all(len(r["rewards"]) == 3 for r in alone)  # a swarm of three: no attacker slot
    assert all(len(r["eval_rewards"]) == 3 for r in alone)  # each honest node evaluated
    for row in summary["attacks"].values():
        assert row["honest_reward_ratio_on_honest_only"] > 0
    for row in summary["defended"].values():
        assert row["honest_reward_ratio_on_honest_only_same"] > 0
    assert all(len(r["round_s"]) == 3 for r in runs)
    absurd_on = next(r for r in runs if r["attack"] == "absurd" and r["defences"])
    absurd_off = next(r for r in runs if r["attack"] == "absurd" and not r["defences"])
    # Off: the huge-question groups reach scoring; on: refused at admission, never trained.
    assert absurd_on["dropped"].get("task_outside_preset", 0) > 0
    # The refusals round by round add up to the run's (a no-attack run's false positives
    # over time: issue 23's tiny 40-round runs refused more every ten rounds).
    assert absurd_on["honest_groups_dropped"] > 0
    for r in runs:
        assert len(r["dropped_by_round"]) == 3
        assert sum(r["dropped_by_round"]) == r["honest_groups_dropped"]
    assert absurd_on["trained_external"].get("attacker", 0) <= absurd_off["trained_external"].get(
        "attacker", 0
    )
    assert (out / "attack.png").read_bytes()[:4] == b"\x89PNG"
    # Each run records what it ran on (the tiny model is built per node: no weights digest),
    # and these, made in one process pool on one machine, agree.
    assert all(r["environment"]["packages"]["torch"] and r["environment"]["numerics"] for r in runs)
    assert summary["environments"] == {"same": True, "differences": [], "unrecorded": []}
    # Issue 23: over NATS by default, the flood-type measure is the whole round's CPU, the
    # payload's trend per round, and what ran.
    assert summary["transport"] == "nats"
    assert summary["model"] == "tiny"
    assert summary["sizes"]["nodes"] == 4
    assert all(len(r["round_cpu_s"]) == 3 and len(r["server_cpu_s"]) == 3 for r in runs)
    assert all(c >= o for r in runs for c, o in zip(r["round_cpu_s"], r["round_s"], strict=True))
    # The honest nodes' own CPU: the attackers' work taken out, their ingest charged back.
    for r in runs:
        assert len(r["round_cpu_honest_s"]) == 3
        assert all(
            0 <= h <= c for h, c in zip(r["round_cpu_honest_s"], r["round_cpu_s"], strict=True)
        )
    for row in summary["attacks"].values():
        assert len(row["payload_by_round_off"]) == 3
        assert "payload_slope_off" in row
    assert summary["attacks"]["absurd"]["asr_on"] == summary["attacks"]["absurd"]["cpu_ratio_on"]
    # The no-attack runs measure each payload detector's rate on honest completions (its
    # floor: text after the answer tag is also honest text); the ratio attacks have none.
    for r in runs:
        assert set(r["payload_base"]) == ({"inject"} if r["attack"] == "none" else set())
        assert all(len(v) == 3 for v in r["payload_base"].values())
    assert 0.0 <= summary["attacks"]["inject"]["payload_no_attack_on"] <= 1.0
    assert "payload_no_attack_on" not in summary["attacks"]["absurd"]
    # Every run records what honest completions said after their answer tag, per round, so
    # a detector written later can be applied to it.
    assert all(len(r["tails"]) == 3 for r in runs)
    assert all(
        isinstance(t, str) and t.strip() == t and t for r in runs for ts in r["tails"] for t in ts
    )
    # The held-out evaluation: the attack runs' three honest nodes, in every 1/1 run.
    for r in runs:
        if r["config"] == "1/1":
            assert len(r["eval_rewards"]) == 3
            assert all(0.0 <= x <= 1.0 for x in r["eval_rewards"])
    assert set(summary["held_out"]["attacks"]) == {"inject", "absurd"}
    assert summary["held_out"]["attacks"]["inject"]["honest_eval_ratio_on"] >= 0.0


def test_attack_rejects_an_unknown_attack(tmp_path):
    result = CliRunner().invoke(
        build_app(),
        ["experiment", "attack", "--quick", "--attacks", "bribe", "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "unknown attack 'bribe'" in result.output


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("--model", "gpt-5", "smollm2-135m"),
        ("--transport", "pigeon", "memory, nats"),
        ("--tasks", "no_such_family", "reasoning-gym family names"),
        ("--nodes", "1", "at least 2"),
        ("--eval-questions", "-3", "0 (no held-out evaluation) or more"),
    ],
)
def test_attack_refuses_a_bad_option_in_one_line_naming_it(tmp_path, option, value, allowed):
    result = CliRunner().invoke(
        build_app(), ["experiment", "attack", "--quick", option, value, "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if option in line]
    assert error, result.output
    assert allowed in " ".join(result.output.replace("│", " ").split())  # rich wraps the box
    assert not (tmp_path / "runs.jsonl").exists()


@pytest.mark.real_model
def test_inject_marker_survives_smollm2_tokens_and_is_detected():
    from sapo_async.policy.models import load_model

    tokenizer = load_model("smollm2-135m").tokenizer
    text = f" <answer>12</answer>{MARKER}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert Inject().carries_payload(tokenizer.decode(ids), "12")
    # So does the tokens attack's run of digits and operators.
    for text in (" <answer>12</answer> 3(/.=", " <answer>12</answer> -7*8"):
        round_trip = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
        assert Tokens().carries_payload(round_trip, "12")
    # The length attack's pad counts SmolLM2's tokens (a run of spaces is one token).
    limit = 32
    padded = Length(limit, tokenizer).padded("12")
    ids = tokenizer.encode(padded, add_special_tokens=False)
    assert len(ids) + 1 in (limit - 1, limit)
    # ... and the repetition check sees the pad in SmolLM2's tokens.
    assert repeated_span(ids) >= DefenceSpec().repetition_limit


@pytest.mark.real_model
@pytest.mark.nats
@pytest.mark.timeout(300)
def test_smollm2_inject_round_runs_over_nats_with_tiny_sizes():
    spec = AttackSpec(
        attacks=("inject",),
        rounds=1,
        seeds=(0,),
        nodes=2,
        attackers=1,
        questions_per_round=1,
        completions_per_question=2,
        local=1,
        external=1,
        max_new_tokens=8,
        model="smollm2-135m",
        train_layers=1,
    )
    m = run_one(spec, "inject", False, 0, (1, 1))
    assert m.honest == [0]
    assert len(m.round_cpu_s) == 1
    assert len(m.server_cpu_s) == 1
    # The honest node saw its own group and the attacker's, and its first round's own
    # completions (before any training on the attacker's) carry no marker.
    assert m.received == 2
    assert m.payload == [0.0]


@pytest.mark.timeout(300)
def test_two_runs_of_one_seed_draw_the_same_groups_and_earn_the_same_rewards():
    # Common random numbers: an attack run and its no-attack control differ only by the
    # attack. The pool was ordered by rollout hash, which covers each group's time stamp,
    # so every run drew other peers' groups: rewards of one seed differed from round 1.
    spec = AttackSpec(
        attacks=("filler",),
        rounds=6,
        seeds=(0,),
        nodes=4,
        attackers=1,
        transport="memory",
    )
    first, second = (run_one(spec, "none", True, 0, (2, 2)) for _ in range(2))
    assert first.trained_external["honest"] > 0  # something was drawn
    assert first.held is not None
    assert len(first.held) == 6  # a round's holds, every round
    assert first.rewards == second.rewards
    assert first.held == second.held
    assert first.trained_external == second.trained_external


def test_the_honest_only_control_evaluates_every_honest_node_of_the_matrix():
    # It ran as a 2-node swarm whose spec names one node an attacker (a valid AttackSpec),
    # so only node 0 answered the held-out questions and the held-out ratio over it had
    # one node's reward where the attack runs have two.
    spec = AttackSpec(
        attacks=("inject",),
        rounds=1,
        seeds=(0,),
        nodes=4,
        attackers=2,
        transport="memory",
        eval_questions=2,
        eval_completions=2,
    )
    m = run_one(spec, "none", True, 0, (1, 1), swarm_nodes=2)
    assert m.config == "1/1@2"
    assert len(m.rewards) == 2
    assert len(m.eval_rewards) == 2
    assert len(run_one(spec, "none", True, 0, (1, 1)).eval_rewards) == 2  # of 4: the honest


def _attack_real_recipe() -> list[str]:
    """The arguments `just attack-real` passes to `sapo_async experiment attack`."""
    lines = (Path(__file__).parents[2] / "Justfile").read_text().splitlines()
    body = lines[lines.index("attack-real *args:") + 1]
    words = shlex.split(body)
    start = words.index("attack") + 1
    return [w for w in words[start:] if w != "{{args}}"]


def _recipe_spec(extra: list[str], monkeypatch) -> tuple[AttackSpec, Path]:
    """The spec and output directory `just attack-real <extra>` runs, not running it."""
    from sapo_async.experiment.attack import runner

    seen = []

    def capture(spec, out_dir, **_):
        seen.append((spec, out_dir))
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_matrix", capture)
    result = CliRunner().invoke(
        build_app(), ["experiment", "attack", *_attack_real_recipe(), *extra]
    )
    assert result.exit_code == 0, result.output
    ((spec, out_dir),) = seen
    return spec, out_dir


@pytest.mark.parametrize(
    ("extra", "settings", "out"),
    [
        ([], [], "docs/results/attack-real-defaults"),
        (["--defence", "stock_lead_share=0", "--out", "s"], ["stock_lead_share=0"], "s"),
        (
            ["--defence", "cut_after_answer=false", "--defence", "brevity_guard=false"],
            ["cut_after_answer=false", "brevity_guard=false"],
            "docs/results/attack-real-defaults",
        ),
    ],
)
def test_attack_real_recipe_runs_a_nodes_default_defences_into_the_named_path(
    extra, settings, out, monkeypatch
):
    # docs/results/attack-real held a matrix run without what had become a node's defaults,
    # because the recipe imitated a node's defences with flags of the experiment's own and
    # they drifted. It passes none now: a node's DefenceSpec reaches every node, a change is
    # named by its [defence] key, and by default it grows the record of a node's defaults.
    from sapo_async.experiment.attack.runner import run_spec
    from sapo_async.experiment.attack.spec import defence_of

    assert not [w for w in _attack_real_recipe() if w.startswith("--defence")]
    spec, out_dir = _recipe_spec(extra, monkeypatch)
    assert spec.model == "smollm2-135m"
    assert out_dir == Path(out)
    assert spec.defence == defence_of(settings)
    assert run_spec(spec, True, 0, (1, 1)).defence == defence_of(settings)
    if not settings:
        assert spec.defence == DefenceSpec()


def test_attack_real_recipe_summarises_the_matrix_recorded_with_flags_imitating_a_node(
    tmp_path, monkeypatch
):
    # docs/results/attack-real-defaults was recorded with the experiment's own settings
    # (--cut-after-answer --brevity-guard --stock-lead-share 0.5 --lead-probation): its
    # recorded command, with the recipe as it is now, still summarises it.
    from sapo_async.experiment.attack.record import load_runs

    record = Path(__file__).parents[2] / "docs/results/attack-real-defaults/runs.jsonl"
    (tmp_path / "runs.jsonl").write_text(record.read_text())
    sizes = ["--attacks", "filler,inject,flood,absurd,length", "--seeds", "4"]
    sizes += ["--eval-questions", "32", "--eval-completions", "8"]
    spec, _ = _recipe_spec([*sizes, "--out", str(tmp_path), "--recorded"], monkeypatch)
    runs = load_runs(tmp_path / "runs.jsonl", spec, recorded=True)
    assert len(runs) == len(record.read_text().splitlines()) - 1
    assert {r.attack for r in runs} == {"none", *spec.attacks}


@pytest.mark.parametrize(
    ("model", "extra", "out"),
    [
        ([], [], "docs/results/attack-defaults"),
        (["--model", "smollm2-135m"], [], "docs/results/attack-real-defaults"),
        ([], ["--defence", "brevity_guard=false"], "docs/results/attack-brevity_guard-false"),
    ],
)
def test_the_attack_clis_default_output_names_the_defences_so_it_never_resumes_another_record(
    model, extra, out, monkeypatch
):
    # docs/results/attack and attack-real hold matrices recorded before a node's defaults
    # were what they are: a plain run there differed from their headers and moved them aside.
    from sapo_async.experiment.attack import runner

    seen = []

    def capture(spec, out_dir, **_):
        seen.append(out_dir)
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_matrix", capture)
    result = CliRunner().invoke(build_app(), ["experiment", "attack", *model, *extra])
    assert result.exit_code == 0, result.output
    assert seen == [Path(out)]
