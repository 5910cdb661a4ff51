"""The explorer's source over the in-memory ledger: snapshots, revisions, logs, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from eth_account import Account

from sapo_async.errors import RejectedInput
from sapo_async.explorer.source import Explorer
from sapo_async.ledger.audit import ledger_scores
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.memory import MemoryLedger
from sapo_async.ledger.recorder import Recorder
from sapo_async.ledger.types import RoundCommitment

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def commit(ledger: MemoryLedger, journal: Journal, node, c: RoundCommitment) -> None:
    async with Recorder(ledger, journal, node) as rec:
        await rec.record(c)
        await rec.wait_idle(10)


def log_line(node: str, rnd: int) -> str:
    report = {"node": node, "name": "n", "round": rnd, "reward_mean": 0.5, "rejections": {}}
    return json.dumps(report) + "\n"


async def test_the_swarm_snapshot_moves_its_revision_only_when_the_ledger_changes(
    tmp_path: Path,
):
    ledger = MemoryLedger("explore", relayer=Account.create())
    a, b = Account.create(), Account.create()
    explorer = Explorer(ledger, chain="memory", logs=tmp_path, refresh_s=0.0)
    empty = await explorer.swarm()
    assert (empty["nodes"], empty["revision"]) == ([], 1)
    assert (await explorer.swarm())["revision"] == 1  # re-read, unchanged

    shared = os.urandom(32)
    with Journal(tmp_path / "j.sqlite") as journal:
        await commit(ledger, journal, a, RoundCommitment(a.address, 0, 0, [shared]))
        await commit(
            ledger, journal, b, RoundCommitment(b.address, 0, 0, [], {a.address: {0: [shared]}})
        )
    swarm = await explorer.swarm()
    assert swarm["revision"] == 2
    assert {n["node"]: n["credit_received"] for n in swarm["nodes"]} == {a.address: 1, b.address: 0}
    assert swarm["usage"] == [{"producer": a.address, "consumer": b.address, "count": 1}]
    # The score is the ledger's own (sapo_async.ledger.score), from the same events.
    expected = await ledger_scores(ledger)
    assert {n["node"]: n["score"] for n in swarm["nodes"]} == {
        n: s.score for n, s in expected.items()
    }
    assert {n["node"]: n["score"] for n in swarm["nodes"]}[a.address] == 1.0

    # A node appending a round to its log changes the snapshot too (its name appears).
    (tmp_path / "a.jsonl").write_text(log_line(a.address, 0))
    swarm = await explorer.swarm()
    assert swarm["revision"] == 3
    assert {n["node"]: n["name"] for n in swarm["nodes"]}[a.address] == "n"
    node = await explorer.node(a.address.lower())
    assert node["reward_curve"] == [[0, 0.5]]


async def test_a_cached_snapshot_is_served_until_it_is_refresh_s_old():
    ledger = MemoryLedger("cached", relayer=Account.create())
    explorer = Explorer(ledger, chain="memory", refresh_s=3600.0)
    await explorer.swarm()
    a = Account.create()
    await ledger.register(a)
    assert (await explorer.swarm())["nodes"] == []  # within the hour: the cached one


async def test_unknown_and_malformed_nodes_are_refused_with_their_reason():
    ledger = MemoryLedger("refuse", relayer=Account.create())
    explorer = Explorer(ledger, chain="memory")
    with pytest.raises(RejectedInput) as unknown:
        await explorer.node(Account.create().address)
    assert unknown.value.reason == "unknown_node"
    with pytest.raises(RejectedInput) as bad:
        await explorer.node("0x1234")
    assert bad.value.reason == "bad_address"


async def test_verify_checks_journals_or_the_visitors_own_proof(tmp_path: Path):
    ledger = MemoryLedger("verify", relayer=Account.create())
    a = Account.create()
    hashes = [os.urandom(32) for _ in range(3)]
    c = RoundCommitment(a.address, 4, 1, hashes)
    with Journal(tmp_path / "j.sqlite") as journal:
        await commit(ledger, journal, a, c)
    explorer = Explorer(ledger, chain="memory", journals=[tmp_path])
    found = await explorer.verify("0x" + hashes[1].hex())
    assert (found["included"], found["journals"], len(found["found"])) == (True, 1, 1)

    proof = ",".join("0x" + p.hex() for p in c.rollout_tree().proof(hashes[1]))
    own = await explorer.verify(hashes[1].hex(), node=a.address, round_="4", proof=proof)
    assert (own["included"], own["journals"]) == (True, 0)
    wrong_round = await explorer.verify(hashes[1].hex(), node=a.address, round_="5", proof=proof)
    assert wrong_round["included"] is False
    for kwargs, reason in [
        ({"round_": "four"}, "bad_round"),
        ({"round_": "-1"}, "bad_round"),
        ({"round_": "4", "kind": "mine"}, "bad_kind"),
        ({"round_": "4", "proof": "0x12"}, "bad_proof"),
    ]:
        with pytest.raises(RejectedInput) as err:
            await explorer.verify(hashes[1].hex(), node=a.address, **kwargs)
        assert err.value.reason == reason


async def test_both_pages_show_the_backlog_the_journals_hold(tmp_path: Path):
    ledger = MemoryLedger("explore", relayer=Account.create())
    a = Account.create()
    logs = tmp_path / "logs"
    logs.mkdir()
    report = json.loads(log_line(a.address, 0)) | {"commitments_pending": 0, "max_pending": 1}
    (logs / "a.jsonl").write_text(json.dumps(report) + "\n")
    explorer = Explorer(ledger, chain="memory", logs=logs, journals=[tmp_path / "j"], refresh_s=0.0)
    with Journal(tmp_path / "j" / "a.sqlite") as journal:
        await commit(ledger, journal, a, RoundCommitment(a.address, 0, 0, [os.urandom(32)]))
        backlog = (await explorer.swarm())["nodes"][0]["backlog"]
        assert (backlog["pending"], backlog["paused"], backlog["source"]) == (0, False, "journal")
        # Two rounds journaled, not landed (the chain is slow): past the node's bound of 1.
        for rnd in (1, 2):
            journal.append(RoundCommitment(a.address, rnd, rnd, [os.urandom(32)]))
    swarm = await explorer.swarm()
    assert swarm["nodes"][0]["backlog"]["pending"] == 2
    assert swarm["nodes"][0]["backlog"]["paused"] is True
    assert swarm["totals"]["paused_for_backlog"] == 1
    assert (await explorer.node(a.address))["backlog"] == swarm["nodes"][0]["backlog"]
    # Without journals the log's last round is all there is, said so.
    blind = Explorer(ledger, chain="memory", logs=logs, refresh_s=0.0)
    backlog = (await blind.node(a.address))["backlog"]
    assert (backlog["pending"], backlog["source"], backlog["as_of_round"]) == (0, "log", 0)
