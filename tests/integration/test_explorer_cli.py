"""``sapo-async explorer`` and ``sapo-async swarm --explorer`` as a volunteer runs them: a
child process answering HTTP, stopped by a signal."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.process import free_port
from sapo_async.wire.reasons import AFTER_ADMISSION

pytest.importorskip("starlette", reason="the explorer extra is not installed")

START_TIMEOUT_S = 240.0  # joins the tiny model's nodes first; a loaded CI machine is slow


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read().decode()


def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[str], log: Path) -> Any:
    """Poll ``check`` (an HTTP look) until it returns something truthy."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {what}:\n{log.read_text()}")
        try:
            found = check()
        except (OSError, ValueError):
            found = None
        if found:
            return found
        time.sleep(0.2)  # between looks over HTTP; the condition is what we wait on
    pytest.fail(f"no {what} within {START_TIMEOUT_S} s:\n{log.read_text()}")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], check=False, capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.split(")")[-1].split()[0] == "Z"


@contextmanager
def command(log: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """Run ``sapo-async ARGS`` with its output in ``log`` (a pipe nobody reads could fill
    and stall it); stop it politely at the end so its nats-server goes with it."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sapo_async", *args], stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.nats
@pytest.mark.evm
def test_explorer_demo_serves_the_page_and_the_swarms_totals_then_stops_on_sigterm(
    tmp_path: Path,
):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["explorer", "--demo", "--port", str(port), "--logs", str(tmp_path / "logs")]
    args += ["--demo-nodes", "2", "--demo-rounds", "2"]
    log = tmp_path / "explorer.out"
    with command(log, *args) as proc:

        def settled() -> dict[str, Any] | None:
            status, _, body = fetch(f"{base}/api/swarm")
            swarm = json.loads(body) if status == 200 else {}
            nodes = swarm.get("nodes", [])
            done = len(nodes) == 2 and all(n["rounds_committed"] == 2 for n in nodes)
            return swarm if done else None

        swarm = wait_for("two nodes with two commitments each", settled, proc, log)
        status, kind, page = fetch(base + "/")
        assert (status, kind.split(";")[0]) == (200, "text/html")
        assert '<script src="/static/explorer.js"' in page
        assert fetch(base + "/static/explorer.js")[0] == 200
        assert sorted(n["name"] for n in swarm["nodes"]) == ["node0", "node1"]
        assert swarm["totals"]["rounds_committed"] == 4
        assert swarm["totals"]["rollouts_committed"] == sum(
            n["rollouts_committed"] for n in swarm["nodes"]
        )
        for n in swarm["nodes"]:
            status, _, body = fetch(f"{base}/api/node/{n['node']}")
            node = json.loads(body)
            assert status == 200
            assert [c["round"] for c in node["timeline"]] == [0, 1]
            assert sum(c["rollouts"] for c in node["timeline"]) == n["rollouts_committed"]
            assert len(node["reward_curve"]) == 2
        status, kind, body = fetch(f"{base}/api/verify/0xzz")
        assert (status, kind) == (400, "application/json")
        assert json.loads(body)["error"]["code"] == "bad_rollout_hash"

        kids = children(proc.pid)
        assert kids, "the demo runs an embedded nats-server"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    out = log.read_text()
    assert proc.returncode == 0, out
    assert "explorer stopped" in out
    assert "Traceback" not in out
    assert all(gone(k) for k in kids), "a child of the explorer outlived it"


@pytest.mark.slow
@pytest.mark.nats
@pytest.mark.evm
def test_swarm_with_explorer_serves_the_swarm_while_it_runs(tmp_path: Path):
    port = free_port()
    # Enough rounds that the swarm is still running when the explorer is asked (4 rounds
    # took 3 s in a CI run and the swarm had exited before the first answer).
    args = ("swarm", "--nodes", "2", "--rounds", "40", "--local", "2", "--external", "2")
    args += ("--regime", "dense", "--log-dir", str(tmp_path), "--explorer")
    log = tmp_path / "swarm.out"
    with command(log, *args, "--explorer-port", str(port)) as proc:

        def listed() -> bool:
            status, _, body = fetch(f"http://127.0.0.1:{port}/api/swarm")
            return status == 200 and len(json.loads(body)["nodes"]) == 2

        wait_for("the explorer listing the swarm's two nodes", listed, proc, log)
        proc.wait(timeout=START_TIMEOUT_S)
    out = log.read_text()
    assert proc.returncode == 0, out
    assert f"explorer: http://127.0.0.1:{port}" in out
    # The closing table lists every check after admission, zeros included.
    assert "honest groups dropped after admission" in out
    assert all(str(reason) in out for reason in AFTER_ADMISSION)


def test_explorer_without_a_ledger_address_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("SAPO_LEDGER_ADDRESS", raising=False)
    result = CliRunner().invoke(build_app(), ["explorer"])
    assert result.exit_code == 2
    assert "pass --contract or set SAPO_LEDGER_ADDRESS" in result.output


def test_explorer_on_a_port_in_use_names_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["explorer", "--rpc", f"http://127.0.0.1:{free_port()}"]
        args += ["--contract", "0x" + "11" * 20, "--port", str(port)]
        result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 2
    assert f"cannot serve the explorer on 127.0.0.1:{port}" in result.output
