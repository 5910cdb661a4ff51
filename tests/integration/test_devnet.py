"""sapo-async devnet: a real subprocess starts NATS and anvil, prints working node settings,
deploys the ledger when its artifact exists, and stops everything on SIGINT."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from sapo_async.ops.config import load_config
from sapo_async.ops.doctor import check_ledger, check_nats
from sapo_async.process import free_port, port_open

pytestmark = [pytest.mark.nats, pytest.mark.anvil, pytest.mark.evm]

REPO = Path(__file__).resolve().parents[2]


def _rpc(url: str, method: str, params: list[object]) -> object:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["result"]


def _read_until(lines: queue.Queue[str | None], marker: str, timeout: float) -> list[str]:
    seen: list[str] = []
    while True:
        line = lines.get(timeout=timeout)  # queue.Empty fails the test on a hang
        if line is None:
            raise AssertionError("devnet exited early:\n" + "".join(seen))
        seen.append(line)
        if marker in line:
            return seen


@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_devnet_prints_settings_a_node_can_use_and_stops_on_sigint(tmp_path: Path) -> None:
    nats_port, anvil_port = free_port(), free_port()
    funded = "0x000000000000000000000000000000000000bEEF"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo_async",
            "devnet",
            "--swarm",
            "devtest",
            "--nats-port",
            str(nats_port),
            "--anvil-port",
            str(anvil_port),
            "--data-dir",
            str(tmp_path / "devnet"),
            "--fund",
            funded,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so a failing test can kill the whole group
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        output = _read_until(lines, "devnet running", timeout=60)
        snippet = "".join(line for line in output if not line.startswith("devnet running"))
        snippet = snippet[snippet.index("# settings for a node") :]
        node_toml = tmp_path / "node.toml"
        node_toml.write_text(snippet)
        cfg = load_config(node_toml)  # what devnet prints is a valid node config
        assert cfg.node.swarm == "devtest"
        assert cfg.nats.urls == (f"nats://127.0.0.1:{nats_port}",)
        assert cfg.ledger.rpc_url == f"http://127.0.0.1:{anvil_port}"

        nats_checks = await check_nats(cfg)
        assert [c.status for c in nats_checks] == ["ok", "ok"], nats_checks
        balance = _rpc(cfg.ledger.rpc_url, "eth_getBalance", [funded, "latest"])
        assert isinstance(balance, str)
        assert int(balance, 16) == 100 * 10**18
        assert cfg.ledger.contract_address is not None
        assert cfg.ledger.chain_id == 31337
        ledger_checks = check_ledger(cfg)
        assert [c.status for c in ledger_checks] == ["ok", "ok"], ledger_checks
        assert "SapoLedger for swarm 'devtest'" in ledger_checks[1].detail

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        reader.join(timeout=5)
        assert not port_open("127.0.0.1", nats_port)
        assert not port_open("127.0.0.1", anvil_port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        reader.join(timeout=5)
        assert proc.stdout is not None
        proc.stdout.close()
