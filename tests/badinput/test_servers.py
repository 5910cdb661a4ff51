"""Servers and chains that cannot serve this node: `sapo-async node` stops in seconds, saying why.

On main each of these either started a node that ran uselessly (a contract with no code,
another swarm's contract, the wrong chain, no gas: it trained, logged warnings and exited 0
with nothing on chain) or failed after minutes with a traceback (a refused NATS URL). The
start-up checks are doctor's own (:mod:`sapo_async.ops.startup`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator

import anyio
import pytest
from eth_account import Account

from sapo_async.errors import LedgerUnavailable
from sapo_async.ledger.anvil import ANVIL_DEV_ADDRESS, ANVIL_DEV_KEY, AnvilProcess
from sapo_async.ledger.deploy import deploy_ledger
from sapo_async.ledger.rpc import rpc_chain
from sapo_async.ops import startup
from sapo_async.ops.config import load_config
from sapo_async.ops.startup import require_funds, run_startup_checks
from sapo_async.process import free_port
from tests.badinput.conftest import PASSWORD, Sandbox
from tests.badinput.harness import assert_refused, invoke

NO_CODE = "0x000000000000000000000000000000000000dEaD"


def _node(sandbox: Sandbox, toml: str, *culprits: str, code: int) -> str:
    path = sandbox.config(toml)
    before = sandbox.snapshot()
    outcome = invoke(["node", "--config", str(path)], env={"SAPO_KEY_PASSWORD": PASSWORD})
    return assert_refused(outcome, *culprits, code=code, before=before, sandbox=sandbox.root)


def _deploy(anvil: AnvilProcess, swarm: str) -> str:
    async def deploy() -> str:
        dev = Account.from_key(ANVIL_DEV_KEY)
        return (await deploy_ledger(rpc_chain(anvil.url), dev, swarm)).address

    return anyio.run(deploy)


@pytest.mark.nats
def test_node_names_a_refused_nats_url_at_once(sandbox: Sandbox) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens here
    _node(
        sandbox,
        f'[nats]\nurls = ["{url}"]\nconnect_timeout_s = 0.5\n[ledger]\nenabled = false\n',
        f"nats {url}",
        "cannot connect",
        "sapo-async devnet",
        code=1,
    )


def test_node_names_a_refused_rpc_url(sandbox: Sandbox) -> None:
    rpc = f"http://127.0.0.1:{free_port()}"
    _node(
        sandbox,
        f'[ledger]\nrpc_url = "{rpc}"\ncontract_address = "{NO_CODE}"\nconnect_timeout_s = 0.5\n',
        f"rpc {rpc}",
        "cannot reach the chain",
        code=1,
    )


@contextlib.contextmanager
def _paused(anvil: AnvilProcess) -> Iterator[int]:
    """anvil stopped with SIGSTOP (its socket accepts, nothing answers), continued after."""
    assert anvil.process is not None
    assert anvil.process.pid is not None
    pid = anvil.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.evm
@pytest.mark.anvil
def test_node_started_during_an_rpc_pause_exits_1_naming_the_url_not_2(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    address = _deploy(anvil_chain, "local")
    with _paused(anvil_chain):
        _node(
            sandbox,
            f'[ledger]\nrpc_url = "{anvil_chain.url}"\ncontract_address = "{address}"\n'
            "chain_id = 31337\nconnect_timeout_s = 1\n",
            f"rpc {anvil_chain.url}",
            "cannot reach the chain",
            code=1,
        )


@pytest.mark.evm
@pytest.mark.anvil
def test_funds_check_during_an_rpc_pause_is_an_outage_not_a_config_error(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    # The chaos run's crash: node 4 passed its start-up checks, loaded its model, and the
    # funds check then met a paused anvil: "funds" failed, a ConfigError, exit 2.
    address = _deploy(anvil_chain, "local")
    cfg = load_config(
        node={"data_dir": str(sandbox.data_dir)},
        ledger={"rpc_url": anvil_chain.url, "contract_address": address, "connect_timeout_s": 1},
    )
    run_startup_checks(cfg)
    chain = rpc_chain(anvil_chain.url, timeout_s=0.5)
    with _paused(anvil_chain), pytest.raises(LedgerUnavailable, match=f"rpc {anvil_chain.url}"):
        require_funds(cfg, ANVIL_DEV_ADDRESS, chain=chain, timeout=0.5)


@pytest.mark.evm
@pytest.mark.anvil
def test_start_up_checks_wait_out_an_rpc_pause(
    sandbox: Sandbox, anvil_chain: AnvilProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = _deploy(anvil_chain, "local")
    cfg = load_config(
        node={"data_dir": str(sandbox.data_dir)},
        ledger={"rpc_url": anvil_chain.url, "contract_address": address, "connect_timeout_s": 60},
    )
    waits: list[float] = []
    real_sleep = time.sleep

    def resume_on_first_wait(seconds: float) -> None:
        # The first failed try backs off: that is when the chain comes back.
        if not waits:
            os.kill(pid, signal.SIGCONT)
        waits.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(startup.time, "sleep", resume_on_first_wait)
    with _paused(anvil_chain) as pid:
        checks = run_startup_checks(cfg, timeout=0.5)
        funds = require_funds(cfg, ANVIL_DEV_ADDRESS, timeout=0.5)
    assert len(waits) == 1
    assert [(c.name.split(" ")[0], c.status) for c in checks] == [("rpc", "ok"), ("contract", "ok")]
    assert funds is not None
    assert funds.status == "ok"


@pytest.mark.evm
@pytest.mark.anvil
def test_node_refuses_a_contract_address_without_code(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    _node(
        sandbox,
        f'[ledger]\nrpc_url = "{anvil_chain.url}"\ncontract_address = "{NO_CODE}"\n',
        "contract",
        f"no contract at {NO_CODE} on chain 31337",
        "redeploy",
        code=2,
    )


@pytest.mark.evm
@pytest.mark.anvil
def test_node_refuses_a_chain_other_than_ledger_chain_id(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    address = _deploy(anvil_chain, "local")
    _node(
        sandbox,
        f'[ledger]\nrpc_url = "{anvil_chain.url}"\ncontract_address = "{address}"\nchain_id = 1\n',
        "chain id",
        "serves chain 31337, but ledger.chain_id is 1",
        code=2,
    )


@pytest.mark.evm
@pytest.mark.anvil
def test_node_refuses_another_swarms_contract(sandbox: Sandbox, anvil_chain: AnvilProcess) -> None:
    address = _deploy(anvil_chain, "other")
    _node(
        sandbox,
        f'[node]\nswarm = "mine"\n[ledger]\nrpc_url = "{anvil_chain.url}"\n'
        f'contract_address = "{address}"\n',
        "contract",
        "not keccak('mine')",
        code=2,
    )


@pytest.mark.evm
@pytest.mark.anvil
def test_node_without_funds_for_gas_is_refused_with_the_fund_command(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    address = _deploy(anvil_chain, "local")
    line = _node(
        sandbox,
        f'[ledger]\nrpc_url = "{anvil_chain.url}"\ncontract_address = "{address}"\n'
        "chain_id = 31337\n",
        "funds",
        "has 0 ETH",
        "sapo-async devnet --fund 0x",
        "ledger.relayer_key_file",
        code=2,
    )
    keystore = json.loads((sandbox.data_dir / "key.json").read_text())  # made, to be funded
    assert keystore["address"].lower() in line.lower()  # the node's own address is named


@pytest.mark.evm
@pytest.mark.anvil
def test_a_funded_node_passes_the_start_up_checks(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    address = _deploy(anvil_chain, "local")
    cfg = load_config(
        node={"data_dir": str(sandbox.data_dir)},
        ledger={"rpc_url": anvil_chain.url, "contract_address": address, "chain_id": 31337},
    )
    checks = run_startup_checks(cfg)
    assert [(c.name.split(" ")[0], c.status) for c in checks] == [("rpc", "ok"), ("contract", "ok")]
    funds = require_funds(cfg, ANVIL_DEV_ADDRESS)
    assert funds is not None
    assert funds.status == "ok"


@pytest.mark.evm
@pytest.mark.anvil
def test_a_funded_relayer_pays_for_an_empty_node(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    address = _deploy(anvil_chain, "local")
    cfg = load_config(
        node={"data_dir": str(sandbox.data_dir)},
        ledger={"rpc_url": anvil_chain.url, "contract_address": address},
    )
    empty = Account.create().address
    funds = require_funds(cfg, empty, relayer=ANVIL_DEV_ADDRESS)
    assert funds is not None
    assert f"the relayer {ANVIL_DEV_ADDRESS}" in funds.detail


def test_node_refuses_a_metrics_port_in_use(sandbox: Sandbox) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _node(
            sandbox,
            f"[ledger]\nenabled = false\n[metrics]\nprometheus_port = {port}\n",
            "metrics.prometheus_port",
            str(port),
            "cannot listen",
            code=2,
        )


@pytest.mark.slow
def test_node_refuses_max_new_tokens_beyond_the_models_context(sandbox: Sandbox) -> None:
    # main started and generated past the tiny model's 64 positions
    _node(
        sandbox,
        '[ledger]\nenabled = false\n[model]\nname_or_path = "tiny"\ndevice = "cpu"\n'
        "[training]\nmax_new_tokens = 100\n",
        "training.max_new_tokens",
        "100",
        "64 tokens",
        code=2,
    )


@pytest.mark.evm
@pytest.mark.anvil
def test_node_with_an_empty_relayer_is_refused_naming_the_relayer(
    sandbox: Sandbox, anvil_chain: AnvilProcess
) -> None:
    address = _deploy(anvil_chain, "local")
    relayer = Account.create()
    key_file = sandbox.root / "relayer.key"
    key_file.write_text(relayer.key.hex() + "\n")
    _node(
        sandbox,
        f'[ledger]\nrpc_url = "{anvil_chain.url}"\ncontract_address = "{address}"\n'
        f'relayer_key_file = "{key_file}"\n',
        "funds",
        f"the relayer {relayer.address} has 0 ETH",
        code=2,
    )
