"""The paper table on the async path: real nodes at their own pace over a real nats-server
with JetStream, the ledger on (embedded EVM), several task families, end to end."""

from __future__ import annotations

import json
import threading

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.experiment.paper_table_async_spec import REAL_TASKS
from sapo_async.tasks.spec import preset

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(900)
def test_async_quick_runs_a_swarm_over_nats_with_the_ledger_and_writes_beside_docs(
    tmp_path, monkeypatch
):
    from sapo_async.node.spec_defence import DefenceSpec
    from tests.fixtures.fabric import child_nats_servers

    before = set(child_nats_servers())
    monkeypatch.chdir(tmp_path)  # the default output directories are relative
    quick = ["experiment", "paper-table", "--path", "async", "--quick", "--seed-offset", "5"]
    # Held-out evaluation on, and the shared arm once more with every node's defences off.
    extra = ["--eval-questions", "2", "--eval-completions", "2", "--side-arms", "2/2+ftis-off"]
    result = CliRunner().invoke(build_app(), [*quick, *extra])
    assert result.exit_code == 0, result.output
    # A smoke run never writes over the recorded results in docs/results/.
    assert not (tmp_path / "docs").exists()
    out = tmp_path / "runs" / "paper-table-async-quick"
    summary = json.loads((out / "sparse.json").read_text())
    assert summary["path"] == "async"
    runs = summary["runs"]
    assert [(r["config"], r["seed"]) for r in runs] == [
        ("4/0", 5),
        ("2/2+ftis", 5),
        ("2/2+ftis-off", 5),
    ]
    for run in runs:
        # Each node answered the held-out questions after its last round.
        assert len(run["eval_rewards"]) == 3
        assert all(0.0 <= r <= 1.0 for r in run["eval_rewards"])
        # The defences each run's nodes ran: a volunteer's defaults, or with -off inactive.
        active = not run["config"].endswith("-off")
        assert run["defence"] == DefenceSpec(active=active).model_dump()
        # 3 nodes x 3 rounds each, every round journaled and committed on the chain.
        assert [len(node) for node in run["rewards"]] == [3, 3, 3]
        assert run["commitments"] == {"confirmed": 9, "pending": 0}
        assert run["rejected"] == {}
        # Groups really crossed the nats-server: every round reports what it admitted.
        assert run["received"] > 0
        # Three families drawn from the mix, each scored by its own verifier.
        assert set(run["family_rewards"]) <= {"chain_sum", "products", "basic_arithmetic"}
        assert len(run["family_rewards"]) >= 2
        counts = sum(n for f in run["family_rewards"].values() for node in f for _, n in node)
        assert counts == 3 * 3 * 4 * 4  # nodes x rounds x B x L completions
        assert len(run["ended_s"]) == 3
        # What it ran on, the model's weights included (same model in every arm).
        assert run["environment"]["weights"] == runs[0]["environment"]["weights"]
        assert run["environment"]["packages"]["torch"]
    assert runs[0]["external_used"] == 0
    assert runs[0]["staleness"] == {}
    # Staleness is recorded for every external group trained on.
    assert sum(runs[1]["staleness"].values()) == runs[1]["external_used"]
    assert set(summary["ratio_to_baseline"]) == {"4/0", "2/2+ftis", "2/2+ftis-off"}
    assert summary["ratio_to_baseline"]["4/0"] == {"5": 1.0}
    assert "2/2+ftis" in summary["filters"]
    assert set(summary["held_out"]["reward"]) == {"4/0", "2/2+ftis", "2/2+ftis-off"}
    assert set(summary["ratios"]["2/2+ftis"]["seeds"]["5"]) == {"training", "held_out"}
    assert summary["defences"]["2/2+ftis"] == DefenceSpec().model_dump()
    assert set(summary["defences_off"]["2/2+ftis"]["5"]) >= {"training_on", "training_off"}
    table = (out / "sparse.md").read_text()
    assert "ratio to 4/0" in table
    assert "mean staleness" in table
    assert (out / "sparse.png").read_bytes()[:4] == b"\x89PNG"
    for name in summary["family_figures"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    # Every nats-server the run started is gone.
    assert set(child_nats_servers()) <= before


def test_async_path_names_a_bad_arm(tmp_path):
    result = CliRunner().invoke(
        build_app(),
        [
            "experiment",
            "paper-table",
            "--path",
            "async",
            "--quick",
            "--arms",
            "4/x",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code != 0
    assert "arm '4/x' must be I/J" in result.output


def test_paper_table_rejects_an_unknown_path(tmp_path):
    result = CliRunner().invoke(
        build_app(),
        ["experiment", "paper-table", "--path", "sideways", "--quick", "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "path must be lockstep or async" in result.output


@pytest.mark.real_model
@pytest.mark.timeout(900)
def test_real_model_quick_table_runs_smollm2_over_nats_and_writes_the_summary(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        build_app(),
        [
            "experiment",
            "paper-table",
            "--path",
            "async",
            "--model",
            "smollm2-135m",
            "--quick",
            "--eval-questions",
            "2",
            "--eval-completions",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "docs").exists()
    out = tmp_path / "runs" / "paper-table-real-quick"
    table = json.loads((out / "smollm2.json").read_text())
    assert table["spec"]["model"] == "smollm2-135m"
    assert table["spec"]["train_layers"] == 1
    for run in table["runs"]:
        assert [len(node) for node in run["rewards"]] == [2, 2]
        assert run["commitments"] == {"confirmed": 4, "pending": 0}
        # The real model's families (the preset's), each scored by its own verifier.
        assert set(run["family_rewards"]) <= {f.family for f in preset(REAL_TASKS)}
        counts = sum(n for f in run["family_rewards"].values() for node in f for _, n in node)
        assert counts == 2 * 2 * 2 * 2
    assert table["runs"][1]["received"] > 0  # SmolLM2's groups crossed the nats-server
    assert table["environments"] == {"same": True, "differences": [], "unrecorded": []}
    summary = json.loads((out / "summary.json").read_text())
    from sapo_async.policy.models.packaged import PACKAGED_MODELS

    assert summary["model_sha256"] == PACKAGED_MODELS["smollm2-135m"].sha256
    assert summary["environments"] == table["environments"]
    assert set(summary["ratio_to_baseline"]) == {"2/0", "1/1"}
    assert set(summary["ratio_to_baseline"]["1/1"]) == {"0"}
    assert summary["sizes"]["max_new_tokens"] == 8
    assert summary["goal_met_every_seed"] in (True, False)
    # Held-out reward of every node beside the training ratio, a volunteer's defences stated.
    from sapo_async.node.spec_defence import DefenceSpec

    assert all(len(run["eval_rewards"]) == 2 for run in table["runs"])
    assert set(summary["ratios"]["1/1"]["seeds"]["0"]) == {"training", "held_out"}
    assert summary["defences"] == dict.fromkeys(("2/0", "1/1"), DefenceSpec().model_dump())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--path", "async", "--model", "gpt-9"], "--model 'gpt-9' is not one of tiny, "),
        (["--model", "smollm2-135m"], "needs --path async"),
    ],
)
def test_paper_table_names_a_bad_model(tmp_path, args, message):
    result = CliRunner().invoke(
        build_app(), ["experiment", "paper-table", "--quick", "--out", str(tmp_path), *args]
    )
    assert result.exit_code != 0
    assert message in result.output


def test_async_path_takes_the_task_preset_it_is_given(tmp_path, monkeypatch):
    # The 200-round table on chain_sum alone (the lockstep table's work) needs --tasks on
    # the async path; it used to be read by the lockstep path only.
    from sapo_async.experiment import paper_table_async as pta

    seen = []

    def capture(spec, out, **_):
        seen.append(spec)
        (out / "sparse.md").parent.mkdir(parents=True, exist_ok=True)
        (out / "sparse.md").write_text("")

    monkeypatch.setattr(pta, "run_async_experiment", capture)
    args = ["experiment", "paper-table", "--path", "async", "--out", str(tmp_path)]
    assert CliRunner().invoke(build_app(), [*args, "--tasks", "cpu"]).exit_code == 0
    assert CliRunner().invoke(build_app(), args).exit_code == 0
    assert [s.tasks for s in seen] == ["cpu", "cpu_mix"]
    bad = CliRunner().invoke(build_app(), [*args, "--tasks", "nope"])
    assert bad.exit_code != 0
    assert "unknown task preset 'nope'" in bad.output


def test_nodes_reaches_the_swarm_on_both_paths_and_one_node_is_refused(tmp_path, monkeypatch):
    # More producers per receiver is the lever the sample-limited argument points to;
    # --nodes used to exist only in the presets, so a larger table needed a code change.
    from sapo_async.experiment import paper_table as pt
    from sapo_async.experiment import paper_table_async as pta

    seen = []

    def capture(stem):
        def run(spec, out, **_):
            seen.append(spec.nodes)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{stem}.md").write_text("")

        return run

    monkeypatch.setattr(pta, "run_async_experiment", capture("sparse"))
    monkeypatch.setattr(pt, "run_experiment", capture("sparse"))
    base = ["experiment", "paper-table", "--regime", "sparse", "--out", str(tmp_path)]
    for path in ("async", "lockstep"):
        args = [*base, "--path", path]
        assert CliRunner().invoke(build_app(), [*args, "--nodes", "5"]).exit_code == 0
        assert CliRunner().invoke(build_app(), args).exit_code == 0
    assert seen == [5, 8, 5, 8]
    bad = CliRunner().invoke(build_app(), [*base, "--path", "async", "--nodes", "1"])
    assert bad.exit_code != 0
    assert "--nodes" in bad.output
    assert len(seen) == 4


_SCORED = threading.local()


def _every_other(self, item, completion_text):
    """A stand-in reward: 1 and 0 in turn, per thread. Untrained, both models rarely
    answer these questions right at 8 tokens (every reward was 0 in a probe swarm of these
    sizes), so in a few rounds of 2 x 2 completions almost no group has rewards that
    differ and nothing is trained; a group's completions are scored one after another in
    one thread, so each group of two scores 1 and 0 here, whoever wrote it: the test is
    about the path (text shared, scored by the receiver, re-tokenised, trained), not luck."""
    _SCORED.n = getattr(_SCORED, "n", 0) + 1
    return float(_SCORED.n % 2)


@pytest.mark.real_model
@pytest.mark.timeout(900)
def test_a_mixed_table_trains_smollm2_and_gemma3_nodes_on_each_others_text(tmp_path, monkeypatch):
    from sapo_async.tasks.reward import Verifier

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Verifier, "score", _every_other)
    mixed = "smollm2-135m+gemma3-270m"
    # Defences off in the shared arm: with them on, a producer of another model waits for
    # the receiver's calibration and its probation, longer than the quick table's rounds.
    args = ["--path", "async", "--model", mixed, "--quick", "--arms", "2/0,1/1-off"]
    result = CliRunner().invoke(build_app(), ["experiment", "paper-table", *args])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "docs").exists()
    out = tmp_path / "runs" / "paper-table-mixed-quick"
    table = json.loads((out / "smollm2-gemma3.json").read_text())
    assert table["spec"]["model"] == mixed
    runs = {run["config"]: run for run in table["runs"]}
    assert set(runs) == {"2/0", "1/1-off"}
    for run in runs.values():
        # Node 0 ran SmolLM2, node 1 Gemma 3, each every round, committed on the chain.
        assert run["models"] == ["smollm2-135m", "gemma3-270m"]
        assert [len(node) for node in run["rewards"]] == [4, 4]
        assert run["commitments"] == {"confirmed": 8, "pending": 0}
        weights = run["environment"]["weights"]
        assert set(weights) == {"smollm2-135m", "gemma3-270m"}
        assert weights["smollm2-135m"] != weights["gemma3-270m"]
    assert runs["2/0"]["retokenised"] == runs["2/0"]["cross_model"] == [0, 0]  # alone
    shared = runs["1/1-off"]
    assert shared["received"] > 0
    # Each node trained on the other model's groups (in a swarm of two, every external
    # group is the other model's), every completion re-tokenised from its text.
    assert all(n > 0 for n in shared["cross_model"]), shared["cross_model"]
    assert sum(shared["cross_model"]) == shared["external_used"]
    assert shared["retokenised"] == [2 * n for n in shared["cross_model"]]
    for model, node in (("smollm2-135m", 0), ("gemma3-270m", 1)):
        section = table["per_model"][model]
        assert section["nodes"] == [node]
        assert set(section["cumulative"]) == {"2/0", "1/1-off"}
        assert set(section["ratios"]) == {"1/1-off"}
        assert section["retokenised"]["1/1-off"] == {"0": shared["retokenised"][node]}
        assert section["cross_model"]["1/1-off"] == {"0": shared["cross_model"][node]}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_model"] == table["per_model"]
    from sapo_async.policy.models.packaged import PACKAGED_MODELS

    assert summary["model_sha256"] == {m: PACKAGED_MODELS[m].sha256 for m in mixed.split("+")}
    md = (out / "smollm2-gemma3.md").read_text()
    assert "**smollm2-135m** (nodes 0)" in md
    assert "**gemma3-270m** (nodes 1)" in md
