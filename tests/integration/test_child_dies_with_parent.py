"""A node killed with SIGKILL leaves no nats-server behind (PR_SET_PDEATHSIG on its child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.nats]

PARENT = """
import sys, time
from pathlib import Path
from sapo_async.fabric.transport.server import spawn_nats_server
server = spawn_nats_server(Path(sys.argv[1]), name="orphan-test").wait_ready()
print("SERVER_PID", server.process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait remains


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)  # polling the condition under a deadline, not waiting it out
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.timeout(60)
def test_nats_server_dies_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    # After `kill -9` of a node, its embedded nats-server kept running (port and store held).
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    server_pid = None
    try:
        assert parent.stdout is not None
        for line in parent.stdout:  # log lines may come first
            if line.startswith("SERVER_PID "):
                server_pid = int(line.split()[1])
                break
        assert server_pid is not None
        assert "nats-server" in Path(f"/proc/{server_pid}/cmdline").read_text()
        assert _alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        parent.stdout.close()
        assert _wait_gone(server_pid, 10), "nats-server outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if server_pid is not None and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
