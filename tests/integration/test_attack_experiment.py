"""The attack experiment's quick mode runs real nodes under attack and writes its outputs
beside, never over, the recorded results."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(900)
def test_attack_quick_measures_each_attack_with_defences_off_and_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output directories are relative
    result = CliRunner().invoke(
        build_app(), ["experiment", "attack", "--quick", "--attacks", "inject,absurd"]
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
    # none off/on, 4/0, and each attack off/on: 3 + 2 x 2 runs of 3 rounds.
    assert len(runs) == 7
    assert all(len(r["round_s"]) == 3 for r in runs)
    absurd_on = next(r for r in runs if r["attack"] == "absurd" and r["defences"])
    absurd_off = next(r for r in runs if r["attack"] == "absurd" and not r["defences"])
    # Off: the huge-question groups reach scoring; on: refused at admission, never trained.
    assert absurd_on["dropped"].get("task_outside_preset", 0) > 0
    assert absurd_on["trained_external"].get("attacker", 0) <= absurd_off["trained_external"].get(
        "attacker", 0
    )
    assert (out / "attack.png").read_bytes()[:4] == b"\x89PNG"


def test_attack_rejects_an_unknown_attack(tmp_path):
    result = CliRunner().invoke(
        build_app(),
        ["experiment", "attack", "--quick", "--attacks", "bribe", "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "unknown attack 'bribe'" in result.output
