"""Two real nodes on one data directory (issue 55): the second exits 2 in one line naming
the directory and the first one's pid, and the first one's death (SIGKILL) frees it.

The first node is held in its start-up checks (a NATS URL nobody serves, retried for two
minutes), after it took the lock and before it loads anything; the second is given one
second to reach NATS, so before the lock it would end at once with exit 1 (unreachable).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sapo_async.lockfile import hold_dir
from sapo_async.process import free_port
from tests.badinput.conftest import Sandbox
from tests.badinput.harness import REPO, assert_refused, run_subprocess

HOLD_S = 60.0
"""How long the first node may take to import and take the lock (seconds on a loaded CPU)."""


def _start_node(config: Path, cwd: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SAPO_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "sapo_async", "node", "--config", str(config)],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_for_holder(lock: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until ``lock`` names ``proc``'s pid (or ``proc`` exits, or HOLD_S passes)."""
    deadline = time.monotonic() + HOLD_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the first node exited {proc.returncode}: {err.decode()}")
        if lock.is_file() and lock.read_text().strip() == str(proc.pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"{lock} did not name the first node (pid {proc.pid}) in {HOLD_S} s")


def test_a_second_node_on_one_data_directory_exits_2_naming_it_and_the_first_ones_pid(
    sandbox: Sandbox,
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    config = sandbox.config(
        f'[nats]\nurls = ["{url}"]\nconnect_timeout_s = 120\n[ledger]\nenabled = false\n'
    )
    first = _start_node(config, sandbox.root)
    try:
        _wait_for_holder(sandbox.data_dir / "node.lock", first)
        before = sandbox.snapshot()
        second = run_subprocess(
            ["node", "--config", str(config)],
            cwd=sandbox.root,
            env={"SAPO_NATS__CONNECT_TIMEOUT_S": "1"},
        )
        assert_refused(
            second,
            f"data directory {sandbox.data_dir}",
            f"pid {first.pid}",
            "one node per data directory",
            before=before,
            sandbox=sandbox.root,
        )
        assert first.poll() is None, "the second node stopped the first"
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    # The kernel released the dead node's lock: no stale lock blocks the next start.
    with hold_dir(sandbox.data_dir, what="data directory", field="node.data_dir", advice=""):
        pass
