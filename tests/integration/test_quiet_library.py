"""The library stays quiet unless the application configures logging (the stdlib
convention httpx, web3.py and nats-py follow), and hands its events, with their context,
to whatever handler the application attaches to the ``sapo_async`` logger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.nats, pytest.mark.evm]

ROOT = Path(__file__).resolve().parents[2]

# A fresh process, as an application is. First a warning with no logging set up at all (the
# stdlib's last-resort handler would print it were the package's NullHandler missing), then
# a short two-node swarm with a handler on the package's logger that keeps every record:
# whatever the library printed itself would still reach stdout or stderr.
CHILD = """
import json, logging, sys

import anyio
import structlog

from sapo_async import Swarm
from sapo_async.logs import get_logger


async def swarm(name: str) -> None:
    settings = dict(
        swarm=name, regime="dense", local=2, external=2, questions_per_round=4,
        completions_per_question=4, rounds=2,
    )
    async with Swarm.join(name="q0", node_index=0, **settings) as a, Swarm.join(
        name="q1", node_index=1, **settings
    ) as b:
        for node in (a, b):
            async for _ in node.rounds():
                pass


records: list[logging.LogRecord] = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record)


get_logger("probe").warning("probe_warned", detail="must not be printed")
package = logging.getLogger("sapo_async")
package.addHandler(Keep())
package.setLevel(logging.DEBUG)
structlog.contextvars.bind_contextvars(run="quiet-test")
anyio.run(swarm, "quiet")
with open(sys.argv[1], "w") as out:
    json.dump(
        [
            {
                "logger": r.name,
                "level": r.levelname,
                "message": r.getMessage(),
                "event": dict(r.msg) if isinstance(r.msg, dict) else None,
            }
            for r in records
        ],
        out,
        default=str,
    )
"""


@pytest.mark.timeout(300)
def test_library_writes_nothing_unless_asked_and_hands_events_with_context_to_a_handler(
    tmp_path: Path,
) -> None:
    kept = tmp_path / "records.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(kept)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout == ""
    assert child.stderr == ""

    records = json.loads(kept.read_text())
    assert records, "the attached handler received no events"
    assert all(r["logger"].startswith("sapo_async.") for r in records)
    assert all(isinstance(r["event"], dict) for r in records)
    assert {r["level"] for r in records} >= {"DEBUG", "INFO"}
    assert "probe_warned" not in {r["event"]["event"] for r in records}  # sent before
    rounds = [r for r in records if r["event"]["event"] == "round_completed"]
    assert {(r["event"]["node_name"], r["event"]["round"]) for r in rounds} == {
        ("q0", 0),
        ("q0", 1),
        ("q1", 0),
        ("q1", 1),
    }
    for r in rounds:
        assert r["logger"] == "sapo_async.node"
        assert r["event"]["component"] == "node"
        assert r["event"]["node"].startswith("0x")
        assert r["event"]["run"] == "quiet-test"  # bound by the application
        # a plain formatter reads the event and its context
        assert r["message"].startswith("round_completed ")
        assert f"node_name='{r['event']['node_name']}'" in r["message"]
    started = [r for r in records if r["event"]["event"] == "nats_server_started"]
    assert [r["logger"] for r in started] == ["sapo_async.nats"]
