"""The explorer over a ledger reached by JSON-RPC (anvil), as ``sapo-async explorer --rpc
URL --contract ADDR --journal J`` serves it: the API's numbers are the contract's, verify
asks the contract, and a wrong contract address is a 502 naming the problem."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from eth_account import Account

from sapo_async.ledger import RoundCommitment, deploy_ledger, rpc_chain
from sapo_async.ledger.connect import connect_ledger
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.recorder import Recorder
from tests.fixtures.ledger import ANVIL_KEY_0, Anvil

pytest.importorskip("starlette", reason="the explorer extra is not installed")

from sapo_async.explorer.app import build_app
from sapo_async.explorer.server import serving
from sapo_async.explorer.source import Explorer

pytestmark = [pytest.mark.evm, pytest.mark.anvil, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn serves on asyncio


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


async def get(url: str) -> tuple[int, dict[str, Any]]:
    """GET in a worker thread: the server answers on this event loop."""
    return await anyio.to_thread.run_sync(_get, url)


async def test_explorer_over_rpc_shows_the_contracts_numbers_and_verifies(
    anvil: Anvil, tmp_path: Path
):
    deployer = Account.from_key(ANVIL_KEY_0)
    ledger = await deploy_ledger(rpc_chain(anvil.url), deployer, "explorer", relayer=deployer)
    a, b = Account.create(), Account.create()
    shared = os.urandom(32)
    journal_path = tmp_path / "journal.sqlite"
    with Journal(journal_path) as journal:
        for node, c in (
            (a, RoundCommitment(a.address, 0, 0, [shared, os.urandom(32)])),
            (b, RoundCommitment(b.address, 0, 0, [os.urandom(32)], {a.address: {0: [shared]}})),
        ):
            async with Recorder(ledger, journal, node) as rec:
                await rec.record(c)
                await rec.wait_idle(60)

    explorer = Explorer(
        connect_ledger(anvil.url, ledger.address), chain=anvil.url, journals=[tmp_path]
    )
    async with serving(build_app(explorer)) as url:
        status, swarm = await get(f"{url}/api/swarm")
        assert status == 200
        assert swarm["chain"] == anvil.url
        for row in swarm["nodes"]:
            stats = await ledger.node_stats(row["node"])
            assert row["rounds_committed"] == stats.rounds_committed == 1
            assert row["rollouts_committed"] == stats.rollouts_committed
            assert row["external_used"] == stats.external_used
            assert row["credit_received"] == stats.credit_received
            assert row["last_seen"] == (await ledger.commitment_of(row["node"], 0)).timestamp
        assert swarm["usage"] == [{"producer": a.address, "consumer": b.address, "count": 1}]

        status, node = await get(f"{url}/api/node/{a.address}")
        assert status == 200
        assert node["credit_by_consumer"] == {b.address: 1}
        assert [c["rollouts"] for c in node["timeline"]] == [2]
        assert node["reward_curve"] == []  # no logs given

        status, answer = await get(f"{url}/api/verify/0x{shared.hex()}")
        assert (status, answer["included"], answer["journals"]) == (200, True, 1)
        assert sorted((f["node"], f["kind"]) for f in answer["found"]) == sorted(
            [(a.address, "own"), (b.address, "external")]
        )
        status, answer = await get(f"{url}/api/verify/0x{os.urandom(32).hex()}")
        assert (status, answer["included"], answer["found"]) == (200, False, [])

    # A contract address where no ledger lives: the chain answers, the ledger cannot be read.
    wrong = Explorer(connect_ledger(anvil.url, deployer.address), chain=anvil.url)
    async with serving(build_app(wrong)) as url:
        status, body = await get(f"{url}/api/swarm")
    assert status == 502
    assert body["error"]["code"] == "ledger_unreadable"
    assert "Traceback" not in body["error"]["message"]
