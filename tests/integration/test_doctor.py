"""sapo-async doctor against real servers: each failure it reports, and the all-good path."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.fabric.transport.embedded import EmbeddedNats
from sapo_async.fabric.transport.server import NatsServer
from sapo_async.ledger.anvil import ANVIL_DEV_KEY, AnvilProcess
from sapo_async.ledger.deploy import deploy_ledger
from sapo_async.ledger.rpc import rpc_chain
from sapo_async.ops.config import NodeConfig, load_config
from sapo_async.ops.doctor import (
    Check,
    check_disk,
    check_ledger,
    check_model,
    check_nats,
    format_checks,
    run_doctor,
)
from sapo_async.process import free_port

NO_CODE_ADDRESS = "0x000000000000000000000000000000000000dEaD"


def _cfg(tmp_path: Path, **sections: dict[str, object]) -> NodeConfig:
    sections.setdefault("node", {})
    sections["node"] = {"data_dir": str(tmp_path / "data"), **sections["node"]}
    return load_config(**sections)


def _by_name(checks: list[Check], prefix: str) -> Check:
    matches = [c for c in checks if c.name.startswith(prefix)]
    assert len(matches) == 1, checks
    return matches[0]


@pytest.mark.anyio
@pytest.mark.nats
async def test_doctor_reports_a_nats_server_that_is_down(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens here
    checks = await check_nats(_cfg(tmp_path, nats={"urls": [url]}), connect_timeout=1)
    check = _by_name(checks, "nats ")
    assert check.failed
    assert "cannot connect" in check.detail
    assert "running and reachable" in check.fix
    assert len(checks) == 1  # no JetStream check without a connection


@pytest.mark.anyio
@pytest.mark.nats
async def test_doctor_reports_a_server_without_jetstream(
    tmp_path: Path, volunteer_nats_without_jetstream: NatsServer
) -> None:
    cfg = _cfg(tmp_path, nats={"urls": [volunteer_nats_without_jetstream.url]})
    checks = await check_nats(cfg, connect_timeout=2)
    assert _by_name(checks, "nats ").status == "ok"
    jetstream = _by_name(checks, "jetstream ")
    assert jetstream.failed
    assert "JetStream is not enabled" in jetstream.detail
    assert "-js" in jetstream.fix


@pytest.mark.anyio
@pytest.mark.nats
async def test_doctor_passes_a_server_with_jetstream(
    tmp_path: Path, volunteer_nats: NatsServer
) -> None:
    checks = await check_nats(_cfg(tmp_path, nats={"urls": [volunteer_nats.url]}))
    assert [c.status for c in checks] == ["ok", "ok"]
    assert "enabled" in _by_name(checks, "jetstream ").detail


@pytest.mark.anyio
async def test_doctor_accepts_the_embedded_server_when_no_urls_are_set(tmp_path: Path) -> None:
    checks = await check_nats(_cfg(tmp_path))
    assert [(c.name, c.status) for c in checks] == [("nats (embedded)", "ok")]


@pytest.mark.anyio
@pytest.mark.nats
async def test_doctor_reports_refused_credentials_with_an_auth_fix(tmp_path: Path) -> None:
    auth = 'authorization { user: "sapo", password: "right" }'
    async with EmbeddedNats(extra_config=auth) as server:
        url = server.url.replace("nats://", "nats://sapo:wrong@")
        checks = await check_nats(_cfg(tmp_path, nats={"urls": [url]}), connect_timeout=2)
    check = _by_name(checks, "nats ")
    assert check.failed
    assert "authorization violation" in check.detail.lower()
    assert "creds_file" in check.fix


@pytest.mark.evm
@pytest.mark.anvil
def test_doctor_reports_a_contract_address_without_code(
    tmp_path: Path, anvil_chain: AnvilProcess
) -> None:
    cfg = _cfg(tmp_path, ledger={"rpc_url": anvil_chain.url, "contract_address": NO_CODE_ADDRESS})
    checks = check_ledger(cfg)
    assert _by_name(checks, "rpc ").status == "ok"
    assert "chain id 31337" in _by_name(checks, "rpc ").detail
    contract = _by_name(checks, "contract")
    assert contract.failed
    assert f"no contract at {NO_CODE_ADDRESS} on chain 31337" in contract.detail
    assert "redeploy" in contract.fix


@pytest.mark.evm
@pytest.mark.anvil
def test_doctor_reports_a_chain_id_mismatch(tmp_path: Path, anvil_chain: AnvilProcess) -> None:
    cfg = _cfg(
        tmp_path,
        ledger={"rpc_url": anvil_chain.url, "contract_address": NO_CODE_ADDRESS, "chain_id": 1},
    )
    check = _by_name(check_ledger(cfg), "chain id")
    assert check.failed
    assert "serves chain 31337" in check.detail


def test_doctor_reports_an_rpc_that_is_down(tmp_path: Path) -> None:
    rpc = f"http://127.0.0.1:{free_port()}"
    cfg = _cfg(tmp_path, ledger={"rpc_url": rpc, "contract_address": NO_CODE_ADDRESS})
    check = _by_name(check_ledger(cfg, timeout=1), "rpc ")
    assert check.failed
    assert "cannot reach the chain" in check.detail
    assert "sapo-async devnet" in check.fix


def test_doctor_reports_disk_and_model_problems(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    assert check_disk(cfg).status == "ok"
    full = check_disk(cfg, min_free_bytes=2**62)
    assert full.failed
    assert "GiB free" in full.detail
    empty_dir = tmp_path / "not-a-model"
    empty_dir.mkdir()
    no_config = check_model(_cfg(tmp_path, model={"name_or_path": str(empty_dir)}))
    assert no_config.failed
    assert "no config.json" in no_config.detail
    (empty_dir / "config.json").write_text("{}")
    assert check_model(_cfg(tmp_path, model={"name_or_path": str(empty_dir)})).status == "ok"
    missing = check_model(_cfg(tmp_path, model={"name_or_path": str(tmp_path / "gone")}))
    assert missing.failed
    not_cached = check_model(_cfg(tmp_path, model={"name_or_path": "nobody/no-such-model"}))
    assert not_cached.status == "warn"
    assert check_model(_cfg(tmp_path)).status == "ok"


@pytest.mark.anyio
@pytest.mark.nats
@pytest.mark.evm
@pytest.mark.anvil
async def test_doctor_all_good_with_jetstream_anvil_and_a_deployed_contract(
    tmp_path: Path, volunteer_nats: NatsServer, anvil_chain: AnvilProcess
) -> None:
    dev = Account.from_key(ANVIL_DEV_KEY)
    address = (await deploy_ledger(rpc_chain(anvil_chain.url), dev, "doctor")).address
    cfg = _cfg(
        tmp_path,
        node={"swarm": "doctor"},
        nats={"urls": [volunteer_nats.url]},
        ledger={"rpc_url": anvil_chain.url, "contract_address": address, "chain_id": 31337},
    )
    checks = await run_doctor(cfg)
    assert not [c for c in checks if c.status != "ok"], format_checks(checks)
    names = [c.name.split(" ")[0] for c in checks]
    assert names == ["nats", "jetstream", "shards", "rpc", "contract", "gpu", "disk", "model"]
    assert "all checks passed" in format_checks(checks)


@pytest.mark.anyio
@pytest.mark.evm
@pytest.mark.anvil
async def test_doctor_warns_when_the_contract_records_another_swarm(
    tmp_path: Path, anvil_chain: AnvilProcess
) -> None:
    dev = Account.from_key(ANVIL_DEV_KEY)
    address = (await deploy_ledger(rpc_chain(anvil_chain.url), dev, "other")).address
    ledger = {"rpc_url": anvil_chain.url, "contract_address": address}
    checks = check_ledger(_cfg(tmp_path, node={"swarm": "mine"}, ledger=ledger))
    contract = _by_name(checks, "contract")
    assert contract.status == "warn"
    assert "not keccak('mine')" in contract.detail


@pytest.mark.nats
def test_doctor_command_exits_non_zero_and_explains_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\ndata_dir = "{tmp_path}"\n[nats]\nurls = ["nats://127.0.0.1:{free_port()}"]\n'
        "[ledger]\nenabled = false\n"
    )
    result = CliRunner().invoke(build_app(), ["doctor", "--config", str(path), "--skip-gpu"])
    assert result.exit_code == 1, result.output
    assert "[FAIL] nats nats://127.0.0.1:" in result.output
    assert "fix:" in result.output
    assert "1 check(s) failed" in result.output


def test_doctor_command_reports_a_bad_config_as_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[training]\nloss_type = "sapo"\n')
    result = CliRunner().invoke(build_app(), ["doctor", "--config", str(path), "--skip-gpu"])
    assert result.exit_code == 1
    assert "training.loss_type" in result.output
