"""What a run records of its environment, and how recorded environments are compared.

The defect behind it: the 4-node SmolLM2 ``real_mix`` table recorded on 2026-12-03 did not
reproduce the next day, and the same commit run again gave the next day's numbers: the
machine's environment had changed and no run had recorded what it was.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
from dataclasses import replace

import torch

from sapo_async.experiment import environment as envmod
from sapo_async.experiment.environment import differences, environment, environments, resume_note


def test_environment_records_the_packages_cpu_and_kernels_this_process_runs_on():
    env = environment()
    assert env["packages"]["torch"] == importlib.metadata.version("torch")
    assert env["packages"]["reasoning-gym"] == importlib.metadata.version("reasoning-gym")
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["cpu"]
    assert "weights" not in env
    # Seeded kernels: the same process rounds the same way twice.
    assert env["numerics"] == environment()["numerics"] == envmod.numerics_probe()
    json.dumps(env)  # goes into the results JSON as it is


def test_the_numerics_probe_tells_apart_a_machine_that_rounds_differently(monkeypatch):
    before = envmod.numerics_probe()
    real_matmul = torch.Tensor.__matmul__

    def rounds_differently(a, b):  # another kernel path: the last bit of every product moves
        out = real_matmul(a, b)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    monkeypatch.setattr(torch.Tensor, "__matmul__", rounds_differently)
    assert envmod.numerics_probe() != before


def test_the_weights_digest_moves_with_one_parameter_by_one_ulp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.bfloat16))
    first = environment(model)["weights"]
    assert environment(model)["weights"] == first
    with torch.no_grad():
        w = model[1].weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0, dtype=w.dtype))
    assert environment(model)["weights"] != first


def test_differences_name_each_key_that_moved_dotted_and_what_one_side_lacks():
    a = {"cpu": "x", "packages": {"torch": "2.13.0", "numpy": "2.4"}, "weights": "aa"}
    b = {"cpu": "x", "packages": {"torch": "2.14.1", "numpy": "2.4"}}
    assert differences(a, b) == ["packages.torch: 2.13.0 -> 2.14.1", "weights: aa -> absent"]
    assert differences(a, a) == []


def test_environments_of_a_table_say_which_runs_recorded_none_and_what_differs():
    env = {"cpu": "x", "packages": {"torch": "2.13.0"}}
    other = {"cpu": "y", "packages": {"torch": "2.13.0"}}
    assert environments([("4/0 seed 0", env), ("2/2 seed 0", env)]) == {
        "same": True,
        "differences": [],
        "unrecorded": [],
    }
    assert environments([("4/0 seed 0", {}), ("4/0 seed 1", env), ("2/2 seed 1", other)]) == {
        "same": False,
        "differences": ["2/2 seed 1: cpu: x -> y"],
        "unrecorded": ["4/0 seed 0"],
    }


def test_resuming_runs_from_another_environment_says_so_in_one_line():
    here = environment()
    assert resume_note([]) is None
    assert resume_note([("4/0 seed 0", {**here, "weights": "ab"})]) is None
    moved = {**here, "packages": {**here["packages"], "torch": "2.4.0"}}
    note = resume_note(
        [("4/0 seed 0", {}), ("2/2 seed 0", {}), ("4/0 seed 1", moved), ("2/2 seed 1", {})]
    )
    assert note is not None
    assert "\n" not in note
    assert "4/0 seed 0, 2/2 seed 0, 2/2 seed 1: no environment recorded" in note
    assert f"4/0 seed 1: packages.torch: 2.4.0 -> {here['packages']['torch']}" in note


def test_a_resumed_table_says_its_runs_were_made_elsewhere_and_records_it(
    tmp_path, monkeypatch, capsys
):
    from sapo_async.experiment import paper_table_async as pta
    from sapo_async.experiment.paper_table_async import AsyncSpec
    from sapo_async.experiment.paper_table_report import write_async_outputs
    from sapo_async.experiment.worker import WORKER_THREADS
    from sapo_async.policy import models
    from tests.unit.test_paper_table_report import _run

    monkeypatch.setattr(models, "ensure_tiny_model", lambda *a, **k: None)
    here = {**environment(), "torch_threads": WORKER_THREADS}  # as a worker's run records it
    elsewhere = {**here, "numerics": "0" * 16, "weights": "w"}
    spec = AsyncSpec(rounds=3, seeds=(4,), arms=("2/0", "1/1"), side_arms=())
    runs = [
        replace(_run("2/0", 4, 1.0), environment={**here, "weights": "w"}),
        replace(_run("1/1", 4, 2.0), environment=elsewhere),
    ]
    write_async_outputs(spec, runs, tmp_path, seconds=1.0)
    summary = pta.run_async_experiment(spec, tmp_path, workers=1, resume=True)
    err = capsys.readouterr().err
    assert f"1/1 seed 4: numerics: {'0' * 16} -> {here['numerics']}" in err
    assert "2/0 seed 4" not in err  # made here
    assert summary["environments"] == {
        "same": False,
        "differences": [f"1/1 seed 4: numerics: {here['numerics']} -> {'0' * 16}"],
        "unrecorded": [],
    }
    assert "Environments: not one for every run" in (tmp_path / "sparse.md").read_text()
    # A run recorded before environments were kept still loads, with none.
    table = json.loads((tmp_path / "sparse.json").read_text())
    for run in table["runs"]:
        del run["environment"]
    (tmp_path / "sparse.json").write_text(json.dumps(table))
    again = pta.recorded_runs(spec, tmp_path / "sparse.json")
    assert [r.environment for r in again] == [{}, {}]


def test_a_resumed_attack_matrix_is_not_told_its_worker_runs_were_made_elsewhere(
    tmp_path, monkeypatch, capsys
):
    # Every run records the one torch thread its worker gives it; the note compared that
    # with this process's default (two here), so each resume said "another environment".
    from sapo_async.experiment.attack import runner
    from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure
    from sapo_async.experiment.worker import WORKER_THREADS
    from sapo_async.policy import models

    monkeypatch.setattr(models, "ensure_tiny_model", lambda *a, **k: None)
    here = {**environment(), "torch_threads": WORKER_THREADS}
    spec = AttackSpec(attacks=("inject",), seeds=(0,), nodes=4, local=1, external=1)
    # Every run a defended-only matrix makes (the sharing gain's no-attack runs included).
    runs = [
        RunMeasure(a, on, 0, c, [0, 1], rewards=[[0.1] * 3] * 4, environment=here)
        for a, on, c in (
            ("none", True, "1/1"),
            ("none", False, "1/1"),
            ("none", False, "2/0"),
            ("inject", True, "1/1"),
        )
    ]
    header = json.dumps({"spec": spec.record()})
    lines = [header, *(json.dumps(dataclasses.asdict(r)) for r in runs)]
    (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n")
    runner.run_matrix(spec, tmp_path, workers=2, defended_only=True)
    assert "another environment" not in capsys.readouterr().err
    # A run whose threads did differ is still named.
    other = {**here, "torch_threads": WORKER_THREADS + 1}
    note = resume_note([("x", other)], torch_threads=WORKER_THREADS)
    assert note is not None
    assert f"torch_threads: {WORKER_THREADS + 1} -> {WORKER_THREADS}" in note
