"""The audit CLI as a volunteer meets it: `audit --swarm` piped (whole addresses, any node's
metadata shown as text) and `verify` finding the journal the node wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest
from eth_account import Account
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.ledger import EvmLedger, RoundCommitment, rpc_chain
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.recorder import Recorder
from tests.fixtures.ledger import ANVIL_KEY_0, Anvil

pytestmark = [pytest.mark.evm, pytest.mark.anvil]


def test_piped_swarm_audit_keeps_addresses_whole_when_a_node_registers_markup(
    anvil: Anvil, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Anyone can register metadata; "[/]" made rich raise MarkupError in every auditor's
    # table, and with a real model id in the metadata column the 80-column default of a
    # pipe cut the addresses.
    runner = CliRunner()
    app = build_app()
    monkeypatch.setenv("DEPLOYER_KEY", ANVIL_KEY_0)
    monkeypatch.delenv("COLUMNS", raising=False)
    out = runner.invoke(app, ["deploy", "--rpc", anvil.url, "--key-env", "DEPLOYER_KEY", "--json"])
    assert out.exit_code == 0, out.output
    address = json.loads(out.stdout)["ledger"]
    ledger = EvmLedger(rpc_chain(anvil.url), address, relayer=Account.from_key(ANVIL_KEY_0))
    nodes = {
        Account.create(): "Qwen/Qwen2.5-0.5B-Instruct",
        Account.create(): "[/]",
        Account.create(): "[red]",
    }

    async def record() -> None:
        with Journal(tmp_path / "j.sqlite") as journal:
            for node, metadata in nodes.items():
                async with Recorder(ledger, journal, node, metadata=metadata) as rec:
                    await rec.record(RoundCommitment(node.address, 0, 0, [os.urandom(32)]))
                    await rec.wait_idle(60)

    anyio.run(record)
    out = runner.invoke(app, ["audit", "--swarm", "--rpc", anvil.url, "--ledger", address])
    assert out.exit_code == 0, out.output
    for node in nodes:
        assert node.address in out.stdout
    assert "[/]" in out.stdout
    assert "[red]" in out.stdout
    out = runner.invoke(
        app, ["audit", next(iter(nodes)).address, "--rpc", anvil.url, "--ledger", address]
    )
    assert out.exit_code == 0, out.output
    # The command reads the event index; its figures are the contract's views'.
    from sapo_async.cli.audit import _audit_json
    from sapo_async.ledger.audit import audit_swarm

    out = runner.invoke(
        app, ["audit", "--swarm", "--json", "--rpc", anvil.url, "--ledger", address]
    )
    assert out.exit_code == 0, out.output
    views = anyio.run(audit_swarm, ledger)
    assert json.loads(out.stdout) == [json.loads(json.dumps(_audit_json(a))) for a in views]


def test_verify_finds_the_journal_the_node_of_the_config_writes(
    anvil: Anvil, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # verify looked in .sapo/ledger-journal.sqlite while nodes write
    # <data_dir>/journal/journal.sqlite: it exited 2 on a node's own rollout.
    from sapo_async.ops.config import load_config
    from sapo_async.ops.hardware import HardwareChoice

    for name in ("SAPO_JOURNAL", "SAPO_LEDGER_RPC", "SAPO_LEDGER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()
    app = build_app()
    monkeypatch.setenv("DEPLOYER_KEY", ANVIL_KEY_0)
    out = runner.invoke(app, ["deploy", "--rpc", anvil.url, "--key-env", "DEPLOYER_KEY", "--json"])
    assert out.exit_code == 0, out.output
    address = json.loads(out.stdout)["ledger"]
    config = tmp_path / "node.toml"
    config.write_text(
        f'[node]\ndata_dir = "{tmp_path / "data"}"\n'
        f'[ledger]\nrpc_url = "{anvil.url}"\ncontract_address = "{address}"\n'
    )
    node = Account.create()
    hardware = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
    spec = load_config(config).to_spec(account=node, hardware=hardware)
    own = os.urandom(32)
    ledger = EvmLedger(rpc_chain(anvil.url), address, relayer=Account.from_key(ANVIL_KEY_0))

    async def record() -> None:
        assert spec.ledger.journal_path is not None
        spec.ledger.journal_path.parent.mkdir(parents=True)
        with Journal(spec.ledger.journal_path) as journal:
            async with Recorder(ledger, journal, node) as rec:
                await rec.record(RoundCommitment(node.address, 0, 0, [own, os.urandom(32)]))
                await rec.wait_idle(60)

    anyio.run(record)
    out = runner.invoke(app, ["verify", "0x" + own.hex(), "--config", str(config)])
    assert out.exit_code == 0, out.output
    assert "INCLUDED" in out.stdout
    monkeypatch.chdir(tmp_path)  # ./node.toml is the default config
    out = runner.invoke(app, ["verify", "0x" + own.hex()])
    assert out.exit_code == 0, out.output
