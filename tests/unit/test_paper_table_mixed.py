"""The two-model table (issue 58): a spec naming two packaged models, each node's model
recorded, and the comparison per model (alone in the all-local arm, shared in the others)
over synthetic runs; nothing here runs a model."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import ConfigError
from sapo_async.experiment import paper_table_async as pta
from sapo_async.experiment.paper_table_async_spec import (
    ASYNC_PRESETS,
    AsyncRun,
    AsyncSpec,
    arm_defence,
    parse_models,
    quick_async,
)
from sapo_async.experiment.paper_table_real import run_start, write_real_summary
from sapo_async.experiment.paper_table_report import write_async_outputs
from sapo_async.experiment.report import goal_over_seeds
from sapo_async.policy.models.packaged import PACKAGED_MODELS

MIXED = "smollm2-135m+gemma3-270m"
SMOL, GEMMA = MIXED.split("+")


def test_two_packaged_models_alternate_over_the_nodes():
    spec = replace(ASYNC_PRESETS["smollm2"], model=MIXED)
    assert spec.models == (SMOL, GEMMA)
    assert spec.mixed
    assert spec.real
    assert [spec.node_model(i) for i in range(spec.nodes)] == [SMOL, GEMMA] * 4


def test_one_model_reads_as_before():
    for model in ("tiny", SMOL, "anything-else"):  # one name is the command line's to check
        spec = AsyncSpec(model=model)
        assert spec.models == (model,)
        assert not spec.mixed
        assert spec.node_model(5) == model


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (f"tiny+{SMOL}", "'tiny' is not a packaged model"),
        (f"{SMOL}+gpt-9", "'gpt-9' is not a packaged model"),
        (f"{SMOL}+", "'' is not a packaged model"),
        (f"{SMOL}+{GEMMA}+{SMOL}", "it joins 3 models"),
        (f"{SMOL}+{SMOL}", "it names the same model twice"),
    ],
)
def test_a_bad_pair_of_models_is_refused_in_one_line_naming_what_is_allowed(model, why):
    with pytest.raises(ConfigError) as err:
        AsyncSpec(model=model)
    message = str(err.value)
    assert message.startswith(f"model {model!r} is not allowed ({why})")
    assert "two different packaged models joined by '+'" in message
    assert f"packaged: {', '.join(sorted(PACKAGED_MODELS))}" in message
    assert "\n" not in message
    assert err.value.field == "model"
    with pytest.raises(ConfigError):
        parse_models(model)


def test_a_mixed_swarm_needs_a_node_per_model_and_an_arm_within_its_questions():
    with pytest.raises(ConfigError, match="at least one node per model"):
        AsyncSpec(model=MIXED, nodes=1)
    with pytest.raises(ConfigError, match=r"arm '8/0': I \(8\) cannot exceed questions_per_round"):
        AsyncSpec(arms=("8/0",), questions_per_round=4)


def test_the_quick_mixed_table_gives_each_model_a_node_and_the_slower_time_to_share():
    quick = quick_async(ASYNC_PRESETS["mixed"])
    assert (quick.nodes, quick.rounds, quick.threads) == (2, 4, 1)
    assert quick.arms == ("2/0", "1/1", "1/1+ftis")
    assert [quick.node_model(i) for i in range(2)] == [SMOL, GEMMA]
    one = quick_async(ASYNC_PRESETS["smollm2"])  # a one-model table's quick version as before
    assert (one.nodes, one.rounds, one.threads, one.arms) == (2, 2, 2, ("2/0", "1/1"))


def _run(arm: str, seed: int, smol: float, gemma: float) -> AsyncRun:
    """Four nodes, two rounds: SmolLM2's nodes (0, 2) earn ``smol`` a round, Gemma's (1,
    3) ``gemma``; held-out reward a tenth of each; re-tokenised completions and the other
    model's groups where shared."""
    shared = not arm.startswith("4/0")
    return AsyncRun(
        config=arm,
        seed=seed,
        rewards=[[smol, smol], [gemma, gemma], [smol, smol], [gemma, gemma]],
        family_rewards={},
        ended_s=[[1.0, 2.0]] * 4,
        staleness={},
        external_used=0,
        received=0,
        external_failed={},
        log_ratios=[],
        commitments={},
        phase_s={},
        seconds=2.0,
        defence=arm_defence(arm).model_dump(mode="json"),
        eval_rewards=[smol / 10, gemma / 10, smol / 10, gemma / 10],
        models=[SMOL, GEMMA, SMOL, GEMMA],
        retokenised=[4, 2, 6, 0] if shared else [0, 0, 0, 0],
        cross_model=[1, 0, 2, 1] if shared else [0, 0, 0, 0],
    )


SPEC = replace(ASYNC_PRESETS["mixed"], nodes=4, rounds=2, seeds=(0, 1), eval_questions=4)
# Per seed: (SmolLM2, Gemma) reward a round in each arm.
REWARDS = {
    "4/0": {0: (0.1, 0.2), 1: (0.1, 0.4)},
    "2/2": {0: (0.2, 0.2), 1: (0.15, 0.6)},
    "2/2+ftis": {0: (0.3, 0.1), 1: (0.1, 0.2)},
}
RUNS = [_run(arm, s, *REWARDS[arm][s]) for arm in SPEC.arms for s in SPEC.seeds]


def test_each_model_is_compared_alone_and_shared_per_seed_with_intervals(tmp_path):
    summary = write_async_outputs(SPEC, RUNS, tmp_path, seconds=1.0)
    for model, k, nodes in ((SMOL, 0, [0, 2]), (GEMMA, 1, [1, 3])):
        section = summary["per_model"][model]
        assert section["nodes"] == nodes
        # Two nodes x two rounds of the model's reward.
        assert section["cumulative"]["2/2"]["1"] == pytest.approx(4 * REWARDS["2/2"][1][k])
        for arm in ("2/2", "2/2+ftis"):
            ratios = [REWARDS[arm][s][k] / REWARDS["4/0"][s][k] for s in SPEC.seeds]
            row = section["ratios"][arm]
            assert [row["seeds"][str(s)]["training"] for s in SPEC.seeds] == pytest.approx(ratios)
            # Held-out rewards scale as the training ones here, so their ratios match.
            assert [row["seeds"][str(s)]["held_out"] for s in SPEC.seeds] == pytest.approx(ratios)
            want = goal_over_seeds(ratios, 1.5)
            assert row["training"]["ci95"] == pytest.approx(want["ci95"])
            assert row["training"]["verdict"] == want["verdict"]
        assert "4/0" not in section["ratios"]  # the model alone is the baseline
        assert section["held_out"]["reward"]["4/0"]["0"] == pytest.approx(REWARDS["4/0"][0][k] / 10)
    assert summary["per_model"][SMOL]["retokenised"]["2/2"] == {"0": 10, "1": 10}
    assert summary["per_model"][GEMMA]["retokenised"]["4/0"] == {"0": 0, "1": 0}
    assert summary["per_model"][SMOL]["cross_model"]["2/2+ftis"] == {"0": 3, "1": 3}
    assert summary["per_model"][GEMMA]["cross_model"]["2/2"] == {"0": 1, "1": 1}
    # The overall table is the whole swarm's, as for one model.
    assert summary["ratio_to_baseline"]["2/2"]["0"] == pytest.approx(0.8 / 0.6)
    stored = json.loads((tmp_path / "smollm2-gemma3.json").read_text())
    assert stored["per_model"] == json.loads(json.dumps(summary["per_model"]))
    assert stored["runs"][0]["models"] == [SMOL, GEMMA, SMOL, GEMMA]
    md = (tmp_path / "smollm2-gemma3.md").read_text()
    assert f"**{SMOL}** (nodes 0, 2)" in md
    assert f"| 2/2 | 0: 0.80, 1: 0.60 | 0: 2.00x, 1: 1.50x | {_text(SMOL, '2/2')}" in md
    assert "| 4/0 | 0: 0.40, 1: 0.40 | 0: 1.00x, 1: 1.00x |  |  | 0: 0, 1: 0 |" in md
    assert md.count(" | 0: 3, 1: 3 |") == 2  # SmolLM2's nodes: 3 of Gemma's groups a seed


def _text(model: str, arm: str) -> str:
    from sapo_async.experiment.report import goal_text

    k = 0 if model == SMOL else 1
    return goal_text(
        goal_over_seeds([REWARDS[arm][s][k] / REWARDS["4/0"][s][k] for s in (0, 1)], 1.5)
    )


def test_a_one_model_table_records_what_it_did_before(tmp_path):
    spec = replace(ASYNC_PRESETS["smollm2"], nodes=4, rounds=2, seeds=(0,), arms=("4/0", "2/2"))
    runs = [
        replace(r, models=[], retokenised=[], cross_model=[])
        for r in RUNS
        if r.seed == 0 and "+" not in r.config
    ]
    summary = write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    assert "per_model" not in summary
    stored = json.loads((tmp_path / "smollm2.json").read_text())
    for run in stored["runs"]:
        assert not {"models", "retokenised", "cross_model"} & set(run)
    assert "Per model" not in (tmp_path / "smollm2.md").read_text()
    assert "per_model" not in write_real_summary(spec, tmp_path)
    # A record from before the per-node models were kept still resumes.
    assert [r.models for r in pta.recorded_runs(spec, tmp_path / "smollm2.json")] == [[], []]


def test_a_mixed_table_resumes_with_each_nodes_model(tmp_path):
    write_async_outputs(SPEC, RUNS, tmp_path, seconds=1.0)
    again = pta.recorded_runs(SPEC, tmp_path / "smollm2-gemma3.json")
    assert [(r.config, r.seed, r.models, r.retokenised, r.cross_model) for r in again] == [
        (r.config, r.seed, r.models, r.retokenised, r.cross_model) for r in RUNS
    ]
    # Another pair of models is another table.
    other = replace(SPEC, model=f"{GEMMA}+{SMOL}")
    assert pta.recorded_runs(other, tmp_path / "smollm2-gemma3.json") == []


def test_the_real_summary_of_a_mixed_table_names_both_models_and_each_start(tmp_path, monkeypatch):
    from sapo_async.experiment import real_baseline

    measured = []

    class Start:
        def __init__(self, model: str) -> None:
            self.model = model

        def as_dict(self) -> dict:
            return {"family": "chain_sum", "reward": 0.1 if self.model == SMOL else 0.0}

    async def baselines(model, families, **_):
        measured.append(model)
        return [Start(model)]

    monkeypatch.setattr(real_baseline, "family_baselines", baselines)
    write_async_outputs(SPEC, RUNS, tmp_path, seconds=1.0)
    starts = run_start(SPEC, tmp_path)
    assert measured == [SMOL, GEMMA]
    assert set(starts) == {SMOL, GEMMA}
    assert sorted(p.name for p in tmp_path.glob("start*.json")) == [
        f"start-{GEMMA}.json",
        f"start-{SMOL}.json",
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["model"] == MIXED
    assert summary["model_sha256"] == {m: PACKAGED_MODELS[m].sha256 for m in (SMOL, GEMMA)}
    assert summary["start"][GEMMA]["families"] == [{"family": "chain_sum", "reward": 0.0}]
    assert summary["per_model"][SMOL]["nodes"] == [0, 2]
    run_start(SPEC, tmp_path)  # measured already at these sizes: kept
    assert measured == [SMOL, GEMMA]


def _mixed_recipe() -> list[str]:
    """The arguments `just paper-table-mixed` passes to `sapo_async experiment paper-table`."""
    lines = (Path(__file__).parents[2] / "Justfile").read_text().splitlines()
    words = shlex.split(lines[lines.index("paper-table-mixed *args:") + 1])
    return [w for w in words[words.index("paper-table") + 1 :] if w != "{{args}}"]


@pytest.mark.parametrize(
    ("extra", "out", "arms", "seeds"),
    [
        ([], "docs/results/paper-table-mixed", ("4/0", "2/2", "2/2+ftis"), (0, 1)),
        (["--quick"], "runs/paper-table-mixed-quick", ("2/0", "1/1", "1/1+ftis"), (0,)),
    ],
)
def test_the_mixed_recipe_runs_the_preset_and_a_smoke_run_stays_out_of_docs(
    tmp_path, monkeypatch, extra, out, arms, seeds
):
    from sapo_async.experiment import paper_table_real

    seen = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paper_table_real, "run_start", lambda s, o, **k: seen.append(k))
    monkeypatch.setattr(paper_table_real, "write_real_summary", lambda s, o: None)

    def table(spec, o, **_):
        seen.append((spec, o))
        o.mkdir(parents=True, exist_ok=True)
        (o / f"{spec.stem}.md").write_text("")

    monkeypatch.setattr(pta, "run_async_experiment", table)
    result = CliRunner().invoke(
        build_app(), ["experiment", "paper-table", *_mixed_recipe(), *extra]
    )
    assert result.exit_code == 0, result.output
    start, (spec, where) = seen
    assert start == {"single_rounds": 40}
    assert where == Path(out)
    assert (spec.model, spec.stem, spec.arms, spec.seeds) == (MIXED, "smollm2-gemma3", arms, seeds)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (f"tiny+{SMOL}", f"model 'tiny+{SMOL}' is not allowed ('tiny' is not a packaged model)"),
        (f"{SMOL}+{GEMMA}+{SMOL}", "is not allowed (it joins 3 models)"),
    ],
)
def test_the_cli_refuses_a_bad_pair_of_models_in_one_line(tmp_path, model, message):
    args = [
        "experiment",
        "paper-table",
        "--path",
        "async",
        "--model",
        model,
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 2
    assert message in re.sub(r"[\s│]+", " ", result.output)  # rich's box, wrapped
    assert "Traceback" not in result.output
    assert not list(tmp_path.iterdir())
