"""The paper-table experiment's quick mode runs the real nodes and writes its outputs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app

pytestmark = [pytest.mark.slow]


@pytest.mark.timeout(600)
def test_paper_table_quick_writes_table_figure_and_json_beside_the_recorded_results(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the default output directories are relative
    result = CliRunner().invoke(
        build_app(), ["experiment", "paper-table", "--quick", "--regime", "sparse"]
    )
    assert result.exit_code == 0, result.output
    # A smoke run never writes over the recorded full results in docs/results/.
    assert not (tmp_path / "docs").exists()
    out = tmp_path / "runs" / "paper-table-quick"
    summary = json.loads((out / "sparse.json").read_text())
    assert [r["config"] for r in summary["runs"]] == ["4/0", "2/2"]
    for run in summary["runs"]:
        assert len(run["rewards"]) == 3
        assert all(len(node) == 3 for node in run["rewards"])
        assert run["rejected"] == {}
    # Only the configuration with J > 0 trains on other nodes' groups.
    assert summary["runs"][0]["external_used"] == 0
    table = (out / "sparse.md").read_text()
    assert "| 2/2 | 0 |" in table
    assert "ratio to 4/0" in table
    assert (out / "sparse.png").read_bytes()[:4] == b"\x89PNG"


def test_paper_table_rejects_an_unknown_regime(tmp_path):
    result = CliRunner().invoke(
        build_app(),
        ["experiment", "paper-table", "--quick", "--regime", "medium", "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "regime must be sparse, dense or both" in result.output
