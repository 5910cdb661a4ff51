"""Audit numbers against what nodes committed; rollout verification; the CLI on anvil."""

from __future__ import annotations

import json
import os
import random
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest
from eth_account import Account
from typer.testing import CliRunner

from sapo_async.cli.audit import swarm_table
from sapo_async.cli.main import build_app
from sapo_async.ledger import (
    EvmLedger,
    RoundCommitment,
    deploy_ledger,
    embedded_chain,
    fund,
    rpc_chain,
)
from sapo_async.ledger.audit import (
    audit_swarm,
    expected_participation,
    verify_rollout,
)
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ledger.recorder import Recorder
from tests.fixtures.ledger import ANVIL_KEY_0, Anvil

pytestmark = [pytest.mark.evm]


def h() -> bytes:
    return os.urandom(32)


async def _swarm_rounds(ledger: EvmLedger, journal: Journal, rounds: int, seed: int) -> list:
    """Four nodes record `rounds` rounds each, training on random shares of each other's output."""
    rng = random.Random(seed)
    nodes = [Account.create() for _ in range(4)]
    published: dict[str, list[tuple[int, bytes]]] = {n.address: [] for n in nodes}
    # A node trains on each rollout at most once (the collector hands it out once), which is
    # what the ledger's credit bound (never above what a producer round shared) relies on.
    used: dict[str, set[bytes]] = {n.address: set() for n in nodes}
    async with AsyncExitStack() as stack:  # recorders close in reverse order: scopes nest
        recorders = [
            await stack.enter_async_context(
                Recorder(
                    ledger, journal, n, metadata=f"model:{i}", retry_base_s=0.05, retry_max_s=0.5
                )
            )
            for i, n in enumerate(nodes)
        ]
        for r in range(rounds):
            for node, rec in zip(nodes, recorders, strict=True):
                own = [h() for _ in range(rng.randint(0, 6))]
                external: dict[str, dict[int, list[bytes]]] = {}
                for other in nodes:
                    pool = [x for x in published[other.address] if x[1] not in used[node.address]]
                    if other is not node and pool and rng.random() < 0.7:
                        k = rng.randint(1, min(3, len(pool)))
                        for producer_round, rollout in rng.sample(pool, k):
                            by_round = external.setdefault(other.address, {})
                            by_round.setdefault(producer_round, []).append(rollout)
                            used[node.address].add(rollout)
                await rec.record(RoundCommitment(node.address, r, r, own, external))
                published[node.address].extend((r, x) for x in own)
        for rec in recorders:
            await rec.wait_idle(120)
        # Every round is on chain now: the claims on producer rounds that landed after
        # their consumer's are settled next (no commitment waited for them).
        for rec in recorders:
            await rec.wait_credit_settled(120)
    return nodes


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_audit_numbers_match_what_the_nodes_committed(tmp_path: Path, anyio_backend):
    chain = embedded_chain()
    relayer = Account.create()
    await fund(chain, relayer.address)
    ledger = await deploy_ledger(chain, relayer, "audit", relayer=relayer)
    with Journal(tmp_path / "j.sqlite") as journal:
        nodes = await _swarm_rounds(ledger, journal, rounds=4, seed=7)
        entries = journal.entries()
        assert all(e.state is EntryState.LANDED for e in entries)
        expected = expected_participation(e.commitment for e in entries)
    audits = await audit_swarm(ledger)
    # recorders register concurrently, so registration order is not the creation order
    assert sorted(a.node for a in audits) == sorted(n.address for n in nodes)
    assert {a.node: a.participation for a in audits} == expected
    for a in audits:
        assert sum(a.credit_by_consumer.values()) == a.participation.credit_received
        assert sum(a.usage_by_producer.values()) == a.participation.external_used
        assert a.metadata.startswith("model:")
    assert sum(a.participation.credit_received for a in audits) == sum(
        a.participation.external_used for a in audits
    )
    assert swarm_table(audits).row_count == 4


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_verify_rollout_proves_own_and_external_hashes_on_chain(
    tmp_path: Path, anyio_backend
):
    chain = embedded_chain()
    relayer = Account.create()
    await fund(chain, relayer.address)
    ledger = await deploy_ledger(chain, relayer, "verify", relayer=relayer)
    a, b = Account.create(), Account.create()
    shared = h()
    commitments = [
        RoundCommitment(a.address, 1, 1, [shared, h(), h()]),
        RoundCommitment(b.address, 3, 1, [h()], {a.address: {1: [shared]}}),
    ]
    with Journal(tmp_path / "j.sqlite") as journal, Journal(tmp_path / "liar.sqlite") as liar:
        for node, c in zip((a, b), commitments, strict=True):
            async with Recorder(ledger, journal, node) as rec:
                await rec.record(c)
                await rec.wait_idle(60)
        found = await verify_rollout(ledger, [journal], shared)
        assert sorted((v.node, v.round, v.kind, v.included) for v in found) == sorted(
            [(a.address, 1, "own", True), (b.address, 3, "external", True)]
        )
        assert await verify_rollout(ledger, [journal], h()) == []
        # A journal claiming a hash the chain never committed does not verify.
        forged = h()
        liar.append(RoundCommitment(a.address, 1, 1, [forged, h()]))
        (result,) = await verify_rollout(ledger, [liar], forged)
        assert not result.included


@pytest.mark.anvil
def test_cli_deploys_audits_and_verifies_on_anvil(anvil: Anvil, tmp_path: Path, monkeypatch):
    runner = CliRunner()
    app = build_app()
    monkeypatch.setenv("DEPLOYER_KEY", ANVIL_KEY_0)
    out = runner.invoke(app, ["deploy", "--rpc", anvil.url, "--key-env", "DEPLOYER_KEY", "--json"])
    assert out.exit_code == 0, out.output
    address = json.loads(out.stdout)["ledger"]

    relayer = Account.from_key(ANVIL_KEY_0)
    ledger = EvmLedger(rpc_chain(anvil.url), address, relayer=relayer)
    a, b = Account.create(), Account.create()
    shared = h()
    journal_path = tmp_path / "j.sqlite"

    async def record() -> None:
        with Journal(journal_path) as journal:
            for node, c in (
                (a, RoundCommitment(a.address, 0, 0, [shared, h()])),
                (b, RoundCommitment(b.address, 0, 0, [h()], {a.address: {0: [shared]}})),
            ):
                async with Recorder(ledger, journal, node) as rec:
                    await rec.record(c)
                    await rec.wait_idle(60)

    anyio.run(record)
    common = ["--rpc", anvil.url, "--ledger", address]
    out = runner.invoke(app, ["audit", a.address, *common, "--json"])
    assert out.exit_code == 0, out.output
    (report,) = json.loads(out.stdout)
    assert report["rounds_committed"] == 1
    assert report["rollouts_committed"] == 2
    assert report["credit_received"] == 1
    assert report["credit_by_consumer"] == {b.address: 1}
    assert report["score"] == 1.0  # one consumer round, every consumer trusted by default
    out = runner.invoke(app, ["audit", a.address, *common, "--trust", a.address, "--json"])
    assert out.exit_code == 0, out.output
    (report,) = json.loads(out.stdout)
    assert report["score"] == 0.0  # b is neither trusted nor used by a trusted consumer
    assert report == json.loads(json.dumps(report))  # plain JSON types only

    out = runner.invoke(app, ["audit", "--swarm", *common])
    assert out.exit_code == 0, out.output
    assert a.address in out.stdout
    assert b.address in out.stdout

    out = runner.invoke(
        app, ["verify", "0x" + shared.hex(), "--journal", str(journal_path), *common]
    )
    assert out.exit_code == 0, out.output
    assert out.stdout.count("INCLUDED") == 2

    out = runner.invoke(app, ["verify", "0x" + h().hex(), "--journal", str(journal_path), *common])
    assert out.exit_code == 1
    out = runner.invoke(app, ["verify", "0x1234", "--journal", str(journal_path), *common])
    assert out.exit_code == 2
    out = runner.invoke(app, ["audit", *common])
    assert out.exit_code == 2
