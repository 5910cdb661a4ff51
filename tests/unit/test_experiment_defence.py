"""The experiments run a node's own defences: no experiment declares a defence default.

The attack experiment once declared eight defence settings with defaults of its own, the
recipe passed flags to imitate a node's, and the two drifted apart: a table meant to
measure a node's defaults measured a node nobody runs. These fail when an experiment's
default differs from a node's ``DefenceSpec()``, and check that an override named by the
spec's own key reaches the nodes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import ConfigError
from sapo_async.experiment import paper_table, paper_table_async
from sapo_async.experiment.attack import runner
from sapo_async.experiment.attack.spec import AttackSpec, defence_of, quick
from sapo_async.experiment.paper_table_async_spec import ASYNC_PRESETS, AsyncSpec
from sapo_async.node.spec import DefenceSpec

EXPERIMENT_SPECS = [AttackSpec, paper_table.ExperimentSpec, AsyncSpec]


@pytest.mark.parametrize("kind", EXPERIMENT_SPECS, ids=lambda k: k.__name__)
def test_no_experiment_spec_declares_a_defence_setting_of_its_own(kind):
    own = {f.name for f in dataclasses.fields(kind)} & set(DefenceSpec.model_fields)
    assert own == set()


def test_the_attack_experiment_runs_a_nodes_default_defences():
    spec = AttackSpec()
    assert spec.defence == DefenceSpec()
    assert quick(spec).defence == DefenceSpec()
    on = runner.run_spec(spec, True, 0, (2, 2))
    assert on.defence == DefenceSpec()
    # "Defences off" is the same spec with its master switch off, nothing else changed.
    off = runner.run_spec(spec, False, 0, (2, 2))
    assert off.defence == DefenceSpec(active=False)


def test_the_defences_off_arm_keeps_a_changed_setting_and_turns_only_active_off():
    spec = AttackSpec(defence=defence_of(["stock_lead_share=0"]))
    off = runner.run_spec(spec, False, 0, (1, 1)).defence
    assert not off.active
    assert off.stock_lead_share == 0
    assert off.model_dump(exclude={"active"}) == spec.defence.model_dump(exclude={"active"})


def test_the_paper_tables_run_a_nodes_default_defences():
    for preset in paper_table.PRESETS.values():
        assert paper_table.node_spec(preset, 2, 2, 0).defence == DefenceSpec()
    for preset in ASYNC_PRESETS.values():
        for arm in preset.all_arms:
            assert paper_table_async.swarm_spec(preset, arm, 0).defence == DefenceSpec()


def test_a_defence_setting_is_named_by_the_node_specs_own_key():
    assert defence_of([]) == DefenceSpec()
    changed = defence_of(["stock_lead_share=0", "cut_after_answer=false", "quarantine_s=60"])
    assert changed == DefenceSpec(stock_lead_share=0, cut_after_answer=False, quarantine_s=60)
    assert defence_of(["calibration_min=4", "calibration_min=8"]).calibration_min == 8


@pytest.mark.parametrize(
    ("settings", "named", "allowed"),
    [
        (["stock_lead_sharee=0"], "stock_lead_sharee", "did you mean 'stock_lead_share'"),
        (["bribe=1"], "bribe", "allowed: active, "),
        (["stock_lead_share=2"], "defence.stock_lead_share", "less than or equal to 1"),
        (["cut_after_answer=maybe"], "defence.cut_after_answer", "valid boolean"),
        (["stock_lead_share"], "stock_lead_share", "KEY=VALUE"),
    ],
)
def test_a_bad_defence_setting_is_refused_in_one_line_naming_it(settings, named, allowed):
    with pytest.raises(ConfigError) as info:
        defence_of(settings)
    message = str(info.value)
    assert "\n" not in message
    assert named in message
    assert allowed in message


def test_every_key_of_a_nodes_defence_spec_is_allowed():
    for key, value in DefenceSpec().model_dump(mode="json").items():
        text = str(value).lower()
        assert defence_of([f"{key}={text}"]) == DefenceSpec(**{key: value})


def _cli(args: list[str], monkeypatch) -> tuple[object, list]:
    """Run ``experiment attack`` with ``args``, capturing the spec and path it would run."""
    seen: list = []

    def capture(spec, out_dir, **_):
        seen.append((spec, out_dir))
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run_matrix", capture)
    return CliRunner().invoke(build_app(), ["experiment", "attack", *args]), seen


def test_the_attack_cli_without_a_defence_option_builds_a_nodes_defaults(monkeypatch):
    result, seen = _cli(["--quick"], monkeypatch)
    assert result.exit_code == 0, result.output
    ((spec, out),) = seen
    assert spec.defence == DefenceSpec()
    assert out == Path("runs/attack-quick")


def test_a_defence_override_by_key_reaches_every_node_and_names_the_output(monkeypatch):
    args = ["--quick", "--defence", "stock_lead_share=0", "--defence", "brevity_guard=false"]
    result, seen = _cli(args, monkeypatch)
    assert result.exit_code == 0, result.output
    ((spec, out),) = seen
    for defences in (True, False):
        node = runner.run_spec(spec, defences, 0, (1, 1)).defence
        assert (node.stock_lead_share, node.brevity_guard) == (0, False)
        assert node.active is defences
    assert out == Path("runs/attack-stock_lead_share-0.0-brevity_guard-false-quick")


@pytest.mark.parametrize(
    ("setting", "allowed"),
    [("bribe=1", "allowed: active, "), ("stock_lead_share=-1", "greater than or equal to 0")],
)
def test_the_attack_cli_refuses_a_bad_defence_setting_in_one_line(
    setting, allowed, monkeypatch, tmp_path
):
    result, seen = _cli(["--quick", "--defence", setting, "--out", str(tmp_path)], monkeypatch)
    assert result.exit_code == 2
    assert seen == []
    flat = " ".join(result.output.replace("│", " ").split())  # rich wraps the box
    assert "'--defence'" in flat
    assert setting.split("=")[0] in flat
    assert allowed in flat
