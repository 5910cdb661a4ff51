"""A volunteer node process is stopped with SIGTERM mid-run and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from eth_account import Account
from safetensors.torch import load_file

from sapo_async.ledger import deploy_ledger, fund, rpc_chain
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ops.devnet import ANVIL_DEV_KEY

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.nats]

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, rpc_url: str, contract: str) -> Path:
    config = tmp_path / "node.toml"
    config.write_text(
        f"""
[node]
swarm = "restart"
data_dir = "{tmp_path / "data"}"
drain_timeout_s = 60

[checkpoint]
every = 2

[ledger]
rpc_url = "{rpc_url}"
contract_address = "{contract}"

[model]
name_or_path = "tiny"
device = "cpu"
backend = "transformers"

[tasks]
regime = "dense"

[training]
questions_per_round = 4
completions_per_question = 4
local = 4
external = 0
max_new_tokens = 16

[metrics]
log_json = true
"""
    )
    return config


def node_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SAPO_KEY_PASSWORD"] = "test-password"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_for_rounds(
    log: Path,
    proc: subprocess.Popen[bytes],
    count: int,
    timeout: float,
    *,
    stepped_past: int | None = None,
) -> list[int]:
    """Rounds completed so far, once at least ``count`` of them are in the log (and, with
    ``stepped_past``, once a round ended at a policy version beyond it: a round whose groups
    all have equal rewards takes no optimizer step, so a fixed count of rounds may not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [e for e in events(log) if e.get("event") == "round_completed"]
        stepped = stepped_past is None or any(e["policy_version"] > stepped_past for e in done)
        if len(done) >= count and stepped:
            return [e["round"] for e in done]
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)  # polling the log for a condition, bounded by the deadline
    raise AssertionError(f"fewer than {count} rounds in {timeout} s:\n{log.read_text()[-3000:]}")


def events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def run_node(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "sapo_async", "node", "--config", str(config)],
            cwd=ROOT,
            env=node_env(),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def checkpoint_path(data: Path) -> Path:
    ckpt = data / "checkpoints"
    return ckpt / (ckpt / "LATEST").read_text().strip()


def manifest(data: Path) -> dict:
    return json.loads((checkpoint_path(data) / "manifest.json").read_text())


def adam_step(path: Path) -> int:
    tensors = load_file(str(path / "optimizer.safetensors"))
    return int(tensors["state.0.step"].item())


@pytest.mark.timeout(900)
def test_sigterm_drains_checkpoints_and_a_restart_resumes_without_double_commits(
    tmp_path, anvil_chain
):
    chain = rpc_chain(anvil_chain.url)
    deployer = Account.from_key(ANVIL_DEV_KEY)
    ledger = anyio.run(lambda: deploy_ledger(chain, deployer, "restart"))
    config = write_config(tmp_path, anvil_chain.url, ledger.address)
    ident = subprocess.run(
        [sys.executable, "-m", "sapo_async", "identity", "--config", str(config)],
        cwd=ROOT,
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    address = next(w for w in ident.stdout.split() if w.startswith("0x") and len(w) == 42)
    anyio.run(lambda: fund(chain, address))

    log1 = tmp_path / "run1.log"
    proc = run_node(config, log1)
    wait_for_rounds(log1, proc, 3, timeout=300, stepped_past=0)
    stop(proc, log1)
    first = manifest(tmp_path / "data")
    # Read now: later checkpoints rotate this one away (the two newest are kept).
    step1 = adam_step(checkpoint_path(tmp_path / "data"))
    rounds1 = [e["round"] for e in events(log1) if e.get("event") == "round_completed"]
    # The drain finished the round in flight and checkpointed after it.
    assert first["round"] == rounds1[-1] + 1
    assert any(e.get("event") == "checkpoint_saved" for e in events(log1))

    log2 = tmp_path / "run2.log"
    proc = run_node(config, log2)
    wait_for_rounds(log2, proc, 2, timeout=300, stepped_past=first["policy_version"])
    stop(proc, log2)
    rounds2 = [e["round"] for e in events(log2) if e.get("event") == "round_completed"]
    resumed = [e for e in events(log2) if e.get("event") == "node_resumed"]
    assert resumed
    assert resumed[0]["round"] == first["round"]
    assert resumed[0]["policy_version"] == first["policy_version"]
    assert rounds2[0] == first["round"]  # continues where it stopped, no round repeated
    second = manifest(tmp_path / "data")
    # Optimizer state carried over: Adam's step count continues from the first run's
    # instead of starting again from zero.
    step2 = adam_step(checkpoint_path(tmp_path / "data"))
    assert step1 > 0
    assert step2 - step1 == second["policy_version"] - first["policy_version"] > 0

    # Every round landed exactly once on the chain, none twice, none lost.
    with Journal(tmp_path / "data" / "journal" / "journal.sqlite") as journal:
        entries = journal.entries(address)
    assert {e.state for e in entries} == {EntryState.LANDED}
    journaled = sorted(e.round for e in entries)
    assert journaled == sorted(set(rounds1) | set(rounds2))
    on_chain = anyio.run(lambda: ledger.rounds_of(address))
    assert on_chain == journaled
