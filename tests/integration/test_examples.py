"""Every example in examples/ runs, as a user runs it: a script in a fresh process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.nats, pytest.mark.evm]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

ROUND_LINE = re.compile(
    r"^(?P<name>ada|bob|cyd) round (?P<round>\d+): reward \d\.\d{3}, shared 8, "
    r"external used (?P<external>\d+)$"
)
SUMMARY_LINE = re.compile(
    r"^(?P<name>ada|bob|cyd): (?P<rounds>\d+) rounds, reward \d\.\d{3} \(first \d+\) -> "
    r"\d\.\d{3} \(last \d+\), (?P<external>\d+) external groups used from (?P<producers>\d+) "
    r"producers, (?P<committed>\d+) commitments on chain$"
)


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


@pytest.mark.timeout(300)
def test_local_swarm_example_prints_only_its_lines_and_every_node_trains_on_shared_groups():
    rounds = 6  # the default is 20; fewer keep the suite fast and still show sharing
    done = run_example("local_swarm", str(rounds))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    per_round = [m for line in lines if (m := ROUND_LINE.match(line))]
    summaries = {m["name"]: m for line in lines if (m := SUMMARY_LINE.match(line))}
    assert len(per_round) + len(summaries) == len(lines), done.stdout  # nothing else
    assert sorted((m["name"], int(m["round"])) for m in per_round) == [
        (name, r) for name in ("ada", "bob", "cyd") for r in range(rounds)
    ]
    assert set(summaries) == {"ada", "bob", "cyd"}
    for name, summary in summaries.items():
        used = sum(int(m["external"]) for m in per_round if m["name"] == name)
        assert int(summary["rounds"]) == rounds
        assert int(summary["external"]) == used > 0, f"{name} trained on no shared group"
        assert int(summary["producers"]) >= 1
        assert int(summary["committed"]) == rounds
