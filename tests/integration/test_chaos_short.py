"""The short chaos run (CI): real node processes on a three-server cluster with anvil,
one fault of each kind (SIGKILL and SIGTERM of a node, SIGKILL of a NATS server, a paused
RPC, a node started in an outage, a locked journal, a full data disk), then the audit:
nothing lost, nothing twice, no crash, every node resumed.

The full run is ``just chaos`` (8 nodes, 10 minutes; bench/results/chaos.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.nats]


@pytest.mark.timeout(900)
def test_short_chaos_run_loses_nothing_duplicates_nothing_and_every_node_resumes(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from chaos import KINDS, run_chaos
    finally:
        sys.path.remove(str(ROOT / "bench"))

    result = run_chaos(nodes=3, duration=20.0, seed=3, work=tmp_path)
    left_out = set(result["fault_kinds_left_out"])  # disk_full without root (no tmpfs)
    assert set(result["faults_injected"]) == set(KINDS) - left_out, result["timeline"]
    assert result["rounds_committed"] > 0
    assert result["commitments_lost"] == 0, result["details"]
    assert result["duplicate_commitments"] == 0, result["details"]
    assert result["acked_groups_lost"] == 0, result["details"]
    assert result["crashes"] == 0, result["details"]
    assert result["nodes_not_resumed"] == [], result["timeline"]
    assert result["restarts"] >= 2  # the killed and the terminated node came back
    assert result["honest_credit_withdrawn"] == 0
