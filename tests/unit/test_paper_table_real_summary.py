"""The real table's summary as issue 58 asks for it: the defence each arm ran (a volunteer's
defaults, checked against ``DefenceSpec()``), held-out reward beside the training reward with
intervals over seeds, and a defences-off arm kept apart and compared."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import anyio
import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import ConfigError
from sapo_async.experiment import paper_table_async as pta
from sapo_async.experiment.paper_table_async_spec import (
    ASYNC_PRESETS,
    AsyncSpec,
    arm_defence,
    parse_arm,
)
from sapo_async.experiment.paper_table_real import write_real_summary
from sapo_async.experiment.paper_table_report import write_async_outputs
from sapo_async.experiment.report import goal_over_seeds
from sapo_async.node.spec_defence import DefenceSpec
from tests.unit.test_paper_table_report import _run

SMOLLM2 = ASYNC_PRESETS["smollm2"]


def _recorded(spec: AsyncSpec, arm: str) -> dict:
    """What a run of ``arm`` records as its defence (``_run_swarm``: its swarm spec's)."""
    return pta.swarm_spec(spec, arm, spec.seeds[0]).defence.model_dump(mode="json")


def test_a_default_async_spec_records_a_volunteers_default_defences():
    for spec in (AsyncSpec(), SMOLLM2):
        for arm in spec.all_arms:
            assert _recorded(spec, arm) == DefenceSpec().model_dump()


def test_the_real_summary_states_the_defences_each_arm_ran(tmp_path):
    spec = replace(SMOLLM2, seeds=(0,), arms=("4/0", "2/2", "2/2-off"))
    runs = [replace(_run(a, 0, 1.0), defence=_recorded(spec, a)) for a in spec.arms]
    write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    summary = write_real_summary(spec, tmp_path)
    assert summary["defences"]["4/0"] == DefenceSpec().model_dump()
    assert summary["defences"]["2/2"] == DefenceSpec().model_dump()
    assert summary["defences"]["2/2-off"] == DefenceSpec(active=False).model_dump()
    stored = json.loads((tmp_path / "summary.json").read_text())
    assert stored["defences"] == summary["defences"]


def test_an_arm_whose_runs_recorded_no_defence_says_none():
    # A table recorded before the defences were kept ran a node's defaults of its day.
    from sapo_async.experiment.paper_table_ratios import arm_defences

    runs = [replace(_run("2/2", 0, 1.0), defence={}), _run("4/0", 0, 1.0)]
    assert arm_defences(["4/0", "2/2"], runs) == {"4/0": DefenceSpec().model_dump(), "2/2": None}


def test_an_off_arm_turns_only_the_master_switch_off_and_is_named_apart():
    assert parse_arm("2/2-off") == (2, 2, "")
    assert parse_arm("2/2+ftis-off") == (2, 2, "ftis")
    spec = AsyncSpec(arms=("4/0", "2/2", "2/2-off"), side_arms=())
    on = pta.swarm_spec(spec, "2/2", 0)
    off = pta.swarm_spec(spec, "2/2-off", 0)
    assert off.defence == DefenceSpec(active=False)
    assert off.defence.model_dump(exclude={"active"}) == on.defence.model_dump(exclude={"active"})
    assert (off.training.local, off.training.external) == (2, 2)
    assert off.swarm != on.swarm
    assert arm_defence("2/2") == DefenceSpec()


@pytest.mark.parametrize("arm", ["2/2-of", "2/2-off-off", "2/2+off", "-off"])
def test_a_bad_off_arm_is_named(arm):
    with pytest.raises(ConfigError, match="arm '"):
        parse_arm(arm)


def test_resume_keeps_an_off_arm_apart_and_reruns_runs_of_another_defence(tmp_path):
    spec = AsyncSpec(rounds=3, seeds=(4,), arms=("2/0", "1/1", "1/1-off"), side_arms=())
    runs = [_run(a, 4, 1.0 + k) for k, a in enumerate(spec.arms)]
    write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    path = tmp_path / "sparse.json"
    again = pta.recorded_runs(spec, path)
    assert [(r.config, r.defence["active"]) for r in again] == [
        ("2/0", True),
        ("1/1", True),
        ("1/1-off", False),
    ]
    # A run recorded with other defences (or none: before they were kept) runs again.
    table = json.loads(path.read_text())
    del table["runs"][0]["defence"]
    table["runs"][1]["defence"] = DefenceSpec(brevity_guard=False).model_dump(mode="json")
    path.write_text(json.dumps(table))
    assert [r.config for r in pta.recorded_runs(spec, path)] == ["1/1-off"]


def test_resume_keeps_a_table_recorded_before_eval_only_without_eval(tmp_path):
    spec = AsyncSpec(rounds=3, seeds=(4,), arms=("2/0", "1/1"), side_arms=())
    write_async_outputs(spec, [_run("2/0", 4, 1.0), _run("1/1", 4, 2.0)], tmp_path, seconds=1.0)
    path = tmp_path / "sparse.json"
    table = json.loads(path.read_text())
    for key in ("eval_questions", "eval_completions"):
        del table["spec"][key]
    path.write_text(json.dumps(table))
    assert len(pta.recorded_runs(spec, path)) == 2
    assert pta.recorded_runs(replace(spec, eval_questions=16), path) == []


def _evaluated(arm: str, seed: int, scale: float, held: float) -> object:
    return replace(_run(arm, seed, scale), eval_rewards=[held, held + 0.1])


def test_held_out_ratios_sit_beside_the_training_ratios_with_intervals_over_seeds(tmp_path):
    spec = replace(SMOLLM2, seeds=(0, 1, 2), arms=("4/0", "2/2"), eval_questions=4)
    held = {0: (0.2, 0.3), 1: (0.2, 0.25), 2: (0.1, 0.15)}  # all-local, shared
    train = {0: 1.9, 1: 1.6, 2: 1.7}
    runs = []
    for s in spec.seeds:
        runs += [_evaluated("4/0", s, 1.0, held[s][0]), _evaluated("2/2", s, train[s], held[s][1])]
    write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    summary = write_real_summary(spec, tmp_path)
    assert summary["held_out"]["reward"]["4/0"]["0"] == pytest.approx(0.25)
    row = summary["ratios"]["2/2"]
    ratios = [(held[s][1] + 0.05) / (held[s][0] + 0.05) for s in spec.seeds]
    assert row["seeds"]["1"] == {
        "training": pytest.approx(1.6),
        "held_out": pytest.approx(ratios[1]),
    }
    for got, want in (
        (row["held_out"], goal_over_seeds(ratios, 1.0)),
        (row["training"], goal_over_seeds(list(train.values()), 1.5)),
    ):
        assert got["ci95"] == pytest.approx(want["ci95"])  # a Student-t interval, 3 seeds
        assert (got["mean"], got["verdict"]) == (pytest.approx(want["mean"]), want["verdict"])
    assert "4/0" not in summary["ratios"]  # the baseline's ratio to itself is no result
    md = (tmp_path / "smollm2.md").read_text()
    assert "held-out" in md
    assert f"1: 1.60x / {ratios[1]:.2f}x" in md


def test_without_eval_the_held_out_section_is_empty_and_no_paragraph_is_written(tmp_path):
    spec = AsyncSpec(rounds=3, seeds=(0,), arms=("2/0", "1/1"), side_arms=())
    summary = write_async_outputs(
        spec, [_run("2/0", 0, 1.0), _run("1/1", 0, 2.0)], tmp_path, seconds=1.0
    )
    assert summary["held_out"]["reward"] == {}
    assert summary["ratios"]["1/1"]["held_out"] is None
    assert summary["defences_off"] == {}
    assert "held-out" not in (tmp_path / "sparse.md").read_text()


def test_the_sharing_gain_is_reported_with_and_without_the_defences_per_seed(tmp_path):
    spec = replace(SMOLLM2, seeds=(0, 1), arms=("4/0", "2/2", "2/2-off"), eval_questions=4)
    runs = []
    for s in spec.seeds:
        runs += [
            _evaluated("4/0", s, 1.0, 0.2),
            _evaluated("2/2", s, 1.8, 0.3),
            _evaluated("2/2-off", s, 1.2 + s, 0.2),
        ]
    write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    summary = write_real_summary(spec, tmp_path)
    gain = summary["defences_off"]["2/2"]
    assert set(gain) == {"0", "1"}
    assert gain["1"]["training_on"] == pytest.approx(1.8)
    assert gain["1"]["training_off"] == pytest.approx(2.2)
    assert gain["0"]["held_out_on"] == pytest.approx(0.35 / 0.25)
    assert gain["0"]["held_out_off"] == pytest.approx(1.0)
    # The goal is the defended arm's: the off arm at 1.2x does not make it unmet.
    assert summary["goal_met_every_seed"] is True
    assert "| 2/2 | 1 | 1.80x / 1.40x | 2.20x / 1.00x |" in (tmp_path / "smollm2.md").read_text()


def test_each_node_is_evaluated_after_the_run_at_most_threads_at_a_time():
    from sapo_async.experiment import held_out_eval

    active = [0]
    most = [0]
    seen = []

    class Completion:
        def __init__(self, reward: float) -> None:
            self.reward = reward

    class Group:
        def __init__(self, rewards: list[float]) -> None:
            self.completions = [Completion(r) for r in rewards]

    class Learner:
        def __init__(self, value: float) -> None:
            self.value = value

        async def evaluate(self, questions, completions, *, seed):
            seen.append((questions, completions, seed))
            active[0] += 1
            most[0] = max(most[0], active[0])
            await anyio.sleep(0.01)
            active[0] -= 1
            return [Group([self.value] * completions)] * questions

    spec = AsyncSpec(eval_questions=3, eval_completions=2, threads=2)
    learners = [Learner(v) for v in (0.0, 0.5, 1.0, 0.25)]
    rewards = anyio.run(pta._held_out, spec, learners)
    assert rewards == [0.0, 0.5, 1.0, 0.25]
    assert most[0] == 2
    assert seen == [(3, 2, held_out_eval.EVAL_SEED)] * 4


def test_the_attack_experiment_and_the_table_share_one_evaluation():
    from sapo_async.experiment import held_out_eval
    from sapo_async.experiment.attack import runner

    assert runner.held_out_reward is held_out_eval.held_out_reward


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [("eval_questions", -1, "0 (no held-out evaluation) or more"), ("eval_completions", 0, "1")],
)
def test_a_bad_eval_size_is_refused_naming_the_field(field, value, allowed):
    with pytest.raises(ConfigError, match=re.escape(allowed)) as info:
        AsyncSpec(**{field: value})
    assert info.value.field == field


def _capture(monkeypatch) -> list[AsyncSpec]:
    seen: list[AsyncSpec] = []

    def capture(spec, out, **_):
        seen.append(spec)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{spec.stem}.md").write_text("")

    monkeypatch.setattr(pta, "run_async_experiment", capture)
    return seen


def test_the_cli_passes_eval_sizes_and_an_off_arm_to_the_async_table(tmp_path, monkeypatch):
    seen = _capture(monkeypatch)
    args = ["experiment", "paper-table", "--path", "async", "--out", str(tmp_path)]
    extra = ["--eval-questions", "32", "--eval-completions", "4", "--arms", "8/0,4/4,4/4-off"]
    result = CliRunner().invoke(build_app(), [*args, *extra])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(build_app(), [*args, "--quick"]).exit_code == 0
    assert [(s.eval_questions, s.eval_completions) for s in seen] == [(32, 4), (0, 8)]
    assert seen[0].arms == ("8/0", "4/4", "4/4-off")


@pytest.mark.parametrize(
    ("extra", "option", "message"),
    [
        (["--path", "async", "--eval-questions", "-1"], "--eval-questions", "or equal to 0"),
        (["--path", "async", "--eval-completions", "0"], "--eval-completions", "or equal to 1"),
        (["--eval-questions", "8"], "--eval-questions", "needs --path async"),
        (["--arms", "4/0,2/2-off"], "", "plain I/J arms, got '2/2-off'"),
    ],
)
def test_the_cli_refuses_a_bad_eval_size_or_an_off_arm_on_lockstep_naming_it(
    tmp_path, monkeypatch, extra, option, message
):
    seen = _capture(monkeypatch)
    args = ["experiment", "paper-table", "--regime", "sparse", "--out", str(tmp_path), *extra]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 2
    assert seen == []
    flat = " ".join(result.output.replace("│", " ").split())  # rich wraps the box
    assert option in flat
    assert message in flat
