"""The attack matrix's record: it says exactly which defences ran, and runs recorded with
the experiment's own defence settings (before it took a node's ``DefenceSpec``) still
load, read as the node settings they set."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from sapo_async.errors import ConfigError
from sapo_async.experiment.attack.record import LEGACY_DEFENCE, load_runs, recorded_spec
from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure, defence_of
from sapo_async.experiment.attack.summary import summarise
from sapo_async.node.spec import DefenceSpec

SPEC = AttackSpec(attacks=("inject",), seeds=(0,), nodes=4, attackers=2, local=1, external=1)
RUN = RunMeasure("inject", True, 0, "1/1", [0, 1], rewards=[[0.5]] * 4, payload=[0.0])


def _legacy(**settings: object) -> dict:
    """SPEC's sizes with the experiment's own defence settings, as records held them."""
    spec = asdict(SPEC)
    del spec["defence"]
    spec |= {old: default for old, (_, default) in LEGACY_DEFENCE.items()} | settings
    return json.loads(json.dumps(spec))


def _write(path, spec: dict) -> None:
    path.write_text(json.dumps({"spec": spec}) + "\n" + json.dumps(asdict(RUN)) + "\n")


def test_the_record_holds_every_setting_of_the_defence_that_ran():
    assert SPEC.record()["defence"] == DefenceSpec().model_dump(mode="json")
    summary = summarise(SPEC, [RUN], seconds=1.0)
    assert summary["spec"]["defence"] == DefenceSpec().model_dump(mode="json")
    changed = AttackSpec(defence=defence_of(["stock_lead_share=0"])).record()
    assert changed["defence"]["stock_lead_share"] == 0


def test_runs_recorded_with_flags_imitating_a_nodes_defaults_load_as_a_nodes_defence(tmp_path):
    # `just attack-real` passed --cut-after-answer --brevity-guard --stock-lead-share 0.5
    # --lead-probation to imitate a node (docs/results/attack-real-defaults).
    path = tmp_path / "runs.jsonl"
    imitated = {"lead_probation": True, "stock_lead_share": 0.5}
    _write(path, _legacy(cut_after_answer=True, brevity_guard=True, **imitated))
    assert load_runs(path, SPEC, recorded=True) == [RUN]
    assert load_runs(path, SPEC) == [RUN]
    header = json.loads(path.read_text().splitlines()[0])
    assert header["spec"]["defence"] == DefenceSpec().model_dump(mode="json")


def test_a_legacy_setting_missing_from_a_record_is_read_as_the_experiments_old_default(
    tmp_path,
):
    # docs/results/attack-real: recorded before the brevity guard and the lead record
    # existed in the experiment, so both ran off.
    path = tmp_path / "runs.jsonl"
    spec = _legacy(cut_after_answer=True)
    for old in ("stock_lead_share", "lead_probation", "brevity_guard"):
        del spec[old]
    _write(path, spec)
    with pytest.raises(ConfigError, match="brevity_guard: recorded false, asked true"):
        load_runs(path, SPEC, recorded=True)
    off = ["stock_lead_share=0", "stock_lead_probation=false", "brevity_guard=false"]
    then = AttackSpec(**{**asdict(SPEC), "defence": defence_of(off)})
    assert load_runs(path, then, recorded=True) == [RUN]


def test_runs_that_measured_a_defence_the_node_no_longer_has_count_as_no_current_spec():
    on = recorded_spec(_legacy(strict_end=True))
    assert on["defence"]["strict_end"] is True  # kept: no current spec has it on
    off = recorded_spec(_legacy())
    assert off["defence"] == DefenceSpec(
        cut_after_answer=False, stock_lead_share=0, brevity_guard=False
    ).model_dump(mode="json") | {"stock_lead_probation": False}
    # The same for a setting a later node spec drops: a defence removed is a defence off.
    spec = SPEC.record()
    assert recorded_spec(spec | {"defence": {"gone_guard": False}})["defence"] == spec["defence"]
    assert recorded_spec(spec | {"defence": {"gone_guard": 0.5}})["defence"]["gone_guard"] == 0.5


def test_summarising_another_specs_record_refuses_in_one_line_and_moves_nothing(tmp_path):
    path = tmp_path / "runs.jsonl"
    _write(path, _legacy(strict_end=True))
    before = path.read_text()
    with pytest.raises(ConfigError) as info:
        load_runs(path, SPEC, recorded=True)
    assert "\n" not in str(info.value)
    assert "defence.brevity_guard: recorded false, asked true" in str(info.value)
    assert path.read_text() == before
    assert list(tmp_path.iterdir()) == [path]
    # Resuming instead keeps the runs beside a fresh record, as for other sizes.
    assert load_runs(path, SPEC) == []
    assert (tmp_path / "runs.jsonl.1").read_text() == before
