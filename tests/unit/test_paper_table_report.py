"""Pure summaries of the async paper table: family means, per-round curves, pace, outputs."""

from __future__ import annotations

import json
import re

import pytest

from sapo_async.errors import ConfigError
from sapo_async.experiment.paper_table_async import AsyncRun, AsyncSpec, parse_arm
from sapo_async.experiment.paper_table_async_spec import arm_defence
from sapo_async.experiment.paper_table_report import (
    family_curve,
    family_means,
    pace,
    write_async_outputs,
)


def _run(config: str, seed: int, scale: float) -> AsyncRun:
    # two nodes, three rounds; node 1 runs twice as slowly as node 0
    return AsyncRun(
        config=config,
        seed=seed,
        rewards=[[0.1 * scale, 0.2 * scale, 0.3 * scale], [0.0, 0.1 * scale, 0.2 * scale]],
        family_rewards={
            "chain_sum": [[[1.0 * scale, 4], [0.0, 0], [2.0 * scale, 4]], [[0.0, 4]] * 3],
            "products": [[[0.0, 4]] * 3, [[0.0, 4]] * 3],
        },
        ended_s=[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]],
        staleness={0: 3, 2: 1} if "/0" not in config else {},
        external_used=4 if "/0" not in config else 0,
        received=10,
        external_failed={},
        log_ratios=[0.1, -0.2],
        commitments={"confirmed": 6, "pending": 0},
        phase_s={"generate": 0.1, "publish": 0.0, "score": 0.0, "train": 0.1},
        seconds=6.0,
        defence=arm_defence(config).model_dump(mode="json"),
    )


def test_family_means_and_curves_weigh_completions_and_carry_empty_rounds():
    run = _run("2/0", 0, 1.0)
    assert family_means(run) == {"chain_sum": pytest.approx(3.0 / 20), "products": 0.0}
    # round 1: node 0 drew no chain_sum question, node 1 four with reward 0
    assert family_curve(run, "chain_sum") == pytest.approx([1 / 8, 0.0, 2 / 8])


def test_pace_reports_the_widest_gap_between_nodes_and_seconds_per_round():
    p = pace(_run("2/0", 0, 1.0))
    assert p["widest_round_gap"] == 2.0  # node 0 done with 3 while node 1 had 1
    assert p["seconds_per_round_min"] == 1.0
    assert p["seconds_per_round_max"] == 2.0
    assert p["last_node_done_s"] == 6.0


def test_outputs_keep_the_lockstep_schema_and_say_na_where_the_baseline_scored_zero(tmp_path):
    spec = AsyncSpec(rounds=3, seeds=(4,), arms=("2/0", "1/1"), side_arms=("0/2+ftis",))
    runs = [_run("2/0", 4, 1.0), _run("1/1", 4, 2.0), _run("0/2+ftis", 4, 1.5)]
    summary = write_async_outputs(spec, runs, tmp_path, seconds=12.0)
    stored = json.loads((tmp_path / "sparse.json").read_text())
    for key in ("spec", "seconds", "paper_cumulative", "runs", "cumulative", "ratio_to_baseline"):
        assert key in stored
    assert summary["ratio_to_baseline"]["1/1"]["4"] == pytest.approx(2.0)
    assert summary["ratio_to_baseline"]["0/2+ftis"]["4"] == pytest.approx(1.5)
    assert summary["family_ratio_to_baseline"]["1/1"]["4"]["products"] is None
    assert summary["staleness"]["1/1"] == {"histogram": {"0": 3, "2": 1}, "groups": 4, "mean": 0.5}
    assert set(summary["filters"]) == {"0/2+ftis"}
    md = (tmp_path / "sparse.md").read_text()
    assert "0.0000 (n/a)" in md
    assert "| 0/2+ftis | 4 |" in md
    assert sorted(p.name for p in tmp_path.glob("family-*.png")) == [
        "family-chain_sum.png",
        "family-products.png",
    ]


def test_jobs_run_every_seed_of_the_main_arms_then_the_side_arms_on_the_first():
    spec = AsyncSpec(seeds=(3, 4), arms=("8/0", "4/4"), side_arms=("0/8", "4/4"))
    assert spec.jobs() == [("8/0", 3), ("4/4", 3), ("8/0", 4), ("4/4", 4), ("0/8", 3)]


@pytest.mark.parametrize("arm", ["4", "4/x", "0/0", "4/4+magic", "-1/2"])
def test_a_bad_arm_is_named(arm):
    with pytest.raises(ConfigError, match=re.escape(f"arm '{arm}'")):
        parse_arm(arm)


def test_resume_keeps_recorded_runs_only_under_the_same_settings(tmp_path):
    from dataclasses import replace

    from sapo_async.experiment.paper_table_async import recorded_runs

    spec = AsyncSpec(rounds=3, seeds=(4,), arms=("2/0", "1/1"), side_arms=())
    runs = [_run("2/0", 4, 1.0), _run("1/1", 4, 2.0)]
    write_async_outputs(spec, runs, tmp_path, seconds=12.0)
    path = tmp_path / "sparse.json"
    again = recorded_runs(spec, path)
    assert [(r.config, r.seed, r.rewards, r.staleness) for r in again] == [
        (r.config, r.seed, r.rewards, r.staleness) for r in runs
    ]
    assert recorded_runs(replace(spec, arms=("2/0",)), path) == [again[0]]
    assert recorded_runs(replace(spec, rounds=4), path) == []
    assert recorded_runs(spec, tmp_path / "absent.json") == []


def test_a_resumed_table_keeps_the_time_its_recorded_swarms_took(tmp_path, monkeypatch):
    # The 8-node SmolLM2 table, resumed with every swarm recorded, read "0.0 min".
    import json

    from sapo_async.experiment import paper_table_async as pta
    from sapo_async.policy import models

    monkeypatch.setattr(models, "ensure_tiny_model", lambda *a, **k: None)
    spec = AsyncSpec(rounds=3, seeds=(4,), arms=("2/0", "1/1"), side_arms=())
    write_async_outputs(spec, [_run("2/0", 4, 1.0), _run("1/1", 4, 2.0)], tmp_path, seconds=8229.0)
    summary = pta.run_async_experiment(spec, tmp_path, workers=1, resume=True)
    assert 8229.0 <= summary["seconds"] < 8229.0 + 60
    assert 8229.0 <= json.loads((tmp_path / "sparse.json").read_text())["seconds"] < 8289.0
    assert "137.2 min" in (tmp_path / "sparse.md").read_text()


def test_a_baseline_that_earned_nothing_gives_no_ratio_not_a_crash(tmp_path):
    # A real model at smoke sizes can end a run with zero reward on every node; the table
    # then has no ratio to take (it used to divide by zero writing the markdown).
    spec = AsyncSpec(rounds=3, seeds=(0,), arms=("2/0", "1/1"), side_arms=())
    runs = [_run("2/0", 0, 0.0), _run("1/1", 0, 1.0)]
    summary = write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    assert summary["ratio_to_baseline"] == {"2/0": {"0": None}, "1/1": {"0": None}}
    assert re.search(r"\| 1/1 \| 0 \| [0-9.]+ \| nanx \|", (tmp_path / "sparse.md").read_text())


@pytest.mark.parametrize(
    ("shared", "met"),
    [
        ({"0": 1.89}, False),  # one seed is not every seed
        ({"0": 1.89, "1": 1.6}, True),
        ({"0": 1.89, "1": 1.02}, False),
        ({"0": 1.89, "1": None}, False),  # a baseline that earned nothing
    ],
)
def test_the_real_summary_calls_the_goal_met_only_on_two_seeds_or_more(tmp_path, shared, met):
    # An 8-node table stopped after its first seed read goal_met_every_seed: true.
    import json
    from dataclasses import asdict, replace

    from sapo_async.experiment.paper_table_async_spec import ASYNC_PRESETS
    from sapo_async.experiment.paper_table_real import write_real_summary

    spec = replace(ASYNC_PRESETS["smollm2"], nodes=8)
    table = {
        "spec": asdict(spec),
        "ratio_to_baseline": {"4/0": dict.fromkeys(shared, 1.0), "2/2": shared},
        "rounds_to_threshold": {},
        "cumulative": {},
        "family_ratio_to_baseline": {},
        "seconds": 1.0,
    }
    (tmp_path / f"{spec.stem}.json").write_text(json.dumps(table))
    summary = write_real_summary(spec, tmp_path)
    assert summary["goal_met_every_seed"] is met
    assert json.loads((tmp_path / "summary.json").read_text())["goal_met_every_seed"] is met
