"""The incremental event index on anvil: same numbers as the views, a few RPC calls per
refresh whatever the swarm's size, resumes after a restart, and rescans after a reorg."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.ledger import EvmLedger, RoundCommitment, deploy_ledger, rpc_chain
from sapo_async.ledger.audit import audit_swarm
from sapo_async.ledger.index import LedgerIndex
from tests.fixtures.ledger import ANVIL_KEY_0, Anvil

pytestmark = [pytest.mark.anyio, pytest.mark.evm, pytest.mark.anvil]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def h(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


async def _ledger(anvil: Anvil) -> EvmLedger:
    dev = Account.from_key(ANVIL_KEY_0)
    return await deploy_ledger(rpc_chain(anvil.url), dev, "index", relayer=dev)


async def _commit(ledger: EvmLedger, node: LocalAccount, round_: int, own: list[bytes], **kw):
    await ledger.register(node)
    return await ledger.submit(
        node, RoundCommitment(node.address, round_, round_, own, **kw).payload()
    )


def _numbers(audits) -> dict:
    return {a.node: (a.metadata, a.last_round, a.participation) for a in audits}


async def test_index_matches_the_views_and_a_refresh_costs_a_few_calls(
    anvil: Anvil, tmp_path: Path
):
    ledger = await _ledger(anvil)
    a, b, c = Account.create(), Account.create(), Account.create()
    shared = h(3)
    await _commit(ledger, a, 1, shared)
    await _commit(ledger, b, 1, h(2), external_hashes={a.address: {1: shared[:2]}})
    # c credits a round of b not on chain yet (a claim), settled once it lands.
    await _commit(ledger, c, 1, [], external_hashes={b.address: {2: h(1)}})
    await _commit(ledger, b, 2, h(1))
    await ledger.settle_credit(c, c.address, 1, b.address, 2)
    index = LedgerIndex(ledger, tmp_path / "index.sqlite")
    assert await index.refresh() > 0
    assert _numbers(index.audits()) == _numbers(await audit_swarm(ledger, breakdown=False))
    assert [(u.producer, u.consumer, u.count) for u in index.credits()] == [
        (u.producer, u.consumer, u.count) for u in await ledger.usage_credits()
    ]
    calls = index.rpc_calls
    assert await index.refresh() == 0
    assert index.rpc_calls - calls <= 3  # block number, last block's hash, head's hash
    index.close()
    # A restart resumes from the file: no rescan, the same numbers.
    again = LedgerIndex(ledger, tmp_path / "index.sqlite")
    assert await again.refresh() == 0
    assert again.rpc_calls <= 3
    assert _numbers(again.audits()) == _numbers(await audit_swarm(ledger, breakdown=False))
    assert len(again.audits()) == 3
    again.close()


async def test_index_rescans_after_a_reorg_of_the_dev_chain(anvil: Anvil, tmp_path: Path):
    ledger = await _ledger(anvil)
    node = Account.create()
    await ledger.register(node)
    w3 = ledger.chain.w3
    snapshot = w3.provider.make_request("evm_snapshot", [])["result"]
    await _commit(ledger, node, 1, h(3))
    index = LedgerIndex(ledger, tmp_path / "index.sqlite")
    await index.refresh()
    assert index.audits()[0].participation.rollouts_committed == 3
    # The chain forgets that block and mines another at the same height.
    assert w3.provider.make_request("evm_revert", [snapshot])["result"] is True
    await _commit(ledger, node, 1, h(5))
    await index.refresh()
    assert [a.participation.rollouts_committed for a in index.audits()] == [5]
    assert _numbers(index.audits()) == _numbers(await audit_swarm(ledger, breakdown=False))
    index.close()


class _Methods:
    """The JSON-RPC methods a ledger's web3 provider is asked, in order."""

    def __init__(self, ledger: EvmLedger) -> None:
        provider = ledger.chain.w3.provider
        self.asked: list[str] = []
        real = provider.make_request

        def counted(method, params):
            self.asked.append(str(method))
            return real(method, params)

        provider.make_request = counted  # type: ignore[method-assign]


async def _credited_swarm(ledger: EvmLedger) -> tuple[LocalAccount, LocalAccount, LocalAccount]:
    a, b, c = Account.create(), Account.create(), Account.create()
    shared = h(3)
    await _commit(ledger, a, 1, shared)
    await _commit(ledger, b, 1, h(2), external_hashes={a.address: {1: shared[:2]}})
    await _commit(ledger, c, 1, [], external_hashes={b.address: {2: h(1)}, a.address: {1: shared}})
    await _commit(ledger, b, 2, h(1))
    await ledger.settle_credit(c, c.address, 1, b.address, 2)
    return a, b, c


async def test_node_page_and_audit_from_the_index_equal_the_contracts_views(anvil: Anvil):
    from sapo_async.explorer.source import Explorer
    from sapo_async.ledger.audit import audit_node

    ledger = await _ledger(anvil)
    nodes = await _credited_swarm(ledger)
    index = LedgerIndex(ledger)
    await index.refresh()
    with_index = Explorer(ledger, chain="anvil", index=index)
    views = Explorer(ledger, chain="anvil")
    for node in nodes:
        assert await with_index.node(node.address) == await views.node(node.address)
        assert index.audit(node.address) == await audit_node(ledger, node.address)
        trusted = [nodes[2].address]
        assert index.audit(node.address, trusted=trusted) == await audit_node(
            ledger, node.address, trusted=trusted
        )
    assert index.audits(breakdown=True) == await audit_swarm(ledger)
    assert index.audit(Account.create().address) is None  # never registered: ask the views
    index.close()


async def test_node_page_makes_no_view_calls_when_the_index_is_present(anvil: Anvil):
    from sapo_async.explorer.source import Explorer

    ledger = await _ledger(anvil)
    a, _, _ = await _credited_swarm(ledger)
    reader = EvmLedger(rpc_chain(anvil.url), ledger.address, from_block=ledger.from_block)
    methods = _Methods(reader)
    explorer = Explorer(reader, chain="anvil", index=LedgerIndex(reader))
    await explorer.node(a.address)  # the first page: the index scans from the deployment
    assert methods.asked
    assert "eth_call" not in methods.asked
    methods.asked.clear()
    await explorer.swarm()  # within refresh_s: the index is not read again
    await explorer.node(a.address)
    assert methods.asked == []
    # Without the index the same page asks the contract's views (the test can fail).
    fresh = EvmLedger(rpc_chain(anvil.url), ledger.address, from_block=ledger.from_block)
    views = _Methods(fresh)  # counted before its first request (web3 keeps the method then)
    await Explorer(fresh, chain="anvil").node(a.address)
    assert "eth_call" in views.asked


async def test_an_index_file_of_the_older_shape_is_rebuilt_from_the_chain(
    anvil: Anvil, tmp_path: Path
):
    import sqlite3

    ledger = await _ledger(anvil)
    a, _, _ = await _credited_swarm(ledger)
    path = tmp_path / "index.sqlite"
    old = sqlite3.connect(path)  # version 1: commitments without policy version and roots
    old.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE commitments (node TEXT, round INTEGER, rollouts INTEGER,"
        " external INTEGER, block INTEGER, timestamp INTEGER, PRIMARY KEY (node, round));"
        "INSERT INTO meta VALUES ('last_block', '999999');"
    )
    old.close()
    index = LedgerIndex(ledger, path)
    assert index.last_block is None
    await index.refresh()
    assert index.commitments(a.address) == await ledger.commitments(a.address)
    index.close()
