"""A volunteer node killed with SIGKILL, then started again, on anvil with a relayer.

The node's own address holds no funds: a relayer (``ledger.relayer_key_file``) sends and
pays for its registration and commitments. After ``kill -9`` the node's embedded
nats-server must go with it, and the restarted node must carry on from the last round it
committed: on chain, rounds strictly increase and the policy version never goes back.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from eth_account import Account

from sapo_async.ledger import deploy_ledger, fund, rpc_chain
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ops.devnet import ANVIL_DEV_KEY
from tests.integration.test_node_restart import (
    ROOT,
    events,
    node_env,
    run_node,
    stop,
    wait_for_rounds,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.nats]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _landed(journal_path: Path, address: str, count: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with Journal(journal_path) as journal:
            states = [e.state for e in journal.entries(address)]
        if states.count(EntryState.LANDED) >= count:
            return
        assert proc.poll() is None
        time.sleep(0.2)  # polling the journal for a condition, bounded by the deadline
    raise AssertionError(f"fewer than {count} commitments landed in 120 s")


REAL_SIZE = {
    'name_or_path = "tiny"': 'name_or_path = "smollm2-135m"',
    'regime = "dense"': 'regime = "dense"\nfamilies = ["basic_arithmetic"]',
    "questions_per_round = 4": "questions_per_round = 2",
    "completions_per_question = 4": "completions_per_question = 2",
    "local = 4": "local = 2",
}
"""The same node at real size: SmolLM2-135M, whose checkpoint is 1.6 GB ("auto": every 10
rounds; here every 2, so the test sees commitments held for a checkpoint and released)."""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "model", ["tiny", pytest.param("smollm2-135m", marks=pytest.mark.real_model)]
)
def test_kill_9_then_restart_never_commits_a_lower_policy_version_and_a_relayer_pays(
    tmp_path: Path, anvil_chain, model: str
) -> None:
    chain = rpc_chain(anvil_chain.url)
    ledger = anyio.run(lambda: deploy_ledger(chain, Account.from_key(ANVIL_DEV_KEY), "restart"))
    relayer = Account.create()
    anyio.run(lambda: fund(chain, relayer.address))
    key_file = tmp_path / "relayer.key"
    key_file.write_text(relayer.key.hex() + "\n")
    key_file.chmod(0o600)
    config = write_config(tmp_path, anvil_chain.url, ledger.address)
    # [checkpoint] every = 2: a round's commitment is journaled only once the checkpoint
    # after it is on disk, so a kill at any point loses no policy version the chain names.
    text = config.read_text().replace("[ledger]\n", f'[ledger]\nrelayer_key_file = "{key_file}"\n')
    if model != "tiny":
        for old, new in REAL_SIZE.items():
            text = text.replace(old, new)
    config.write_text(text)
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
    journal_path = tmp_path / "data" / "journal" / "journal.sqlite"

    log1 = tmp_path / "run1.log"
    proc = run_node(config, log1)
    try:
        # The tiny model steps within 3 rounds; SmolLM2 at 16 tokens rarely answers in the
        # tags, so its policy version may stay 0 (the rounds and commitments are the test).
        wait_for_rounds(log1, proc, 3, timeout=300, stepped_past=0 if model == "tiny" else None)
        _landed(journal_path, address, 2, proc)
        (nats,) = [e["pid"] for e in events(log1) if e.get("event") == "nats_server_started"]
        assert _alive(nats)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 15
    while _alive(nats) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the server's exit, bounded by the deadline
    assert not _alive(nats), "the embedded nats-server outlived its node"
    with Journal(journal_path) as journal:
        before = journal.entries(address)
    last_committed = max(e.round for e in before)
    version_committed = max(e.commitment.policy_version for e in before)

    log2 = tmp_path / "run2.log"
    proc = run_node(config, log2)
    try:
        wait_for_rounds(log2, proc, 2, timeout=300)
        (resumed,) = [e for e in events(log2) if e.get("event") == "node_resumed"]
        # Resumed just after the last round it committed (commitments wait for the
        # checkpoint after their round), with at least the policy version it committed.
        assert resumed["round"] in (last_committed + 1, last_committed + 2)
        assert resumed["policy_version"] >= version_committed
        assert not [e for e in events(log2) if e.get("event") == "resumed_behind_journal"]
        _landed(journal_path, address, len(before) + 2, proc)
    finally:
        stop(proc, log2)

    on_chain = anyio.run(lambda: ledger.commitments(address))
    rounds = [c.round for c in on_chain]
    versions = [c.policy_version for c in on_chain]
    assert rounds == sorted(set(rounds))
    assert versions == sorted(versions), f"policy version went back on chain: {versions}"
    assert len(on_chain) >= len(before) + 2
    # The relayer paid for everything: the node's own address never held or spent any gas.
    assert chain.w3.eth.get_balance(address) == 0
    assert chain.w3.eth.get_transaction_count(address) == 0
