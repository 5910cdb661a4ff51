"""The Recorder on a real chain: ordering, exactly-once, retries, restart and crash faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.actors import ActorState
from sapo_async.errors import ActorStopped, LedgerError, LedgerUnavailable, RejectedInput
from sapo_async.ledger import (
    CommitmentPayload,
    EvmLedger,
    RoundCommitment,
    SubmitReceipt,
    deploy_ledger,
    embedded_chain,
    fund,
    open_embedded_ledger,
    rpc_chain,
)
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ledger.recorder import Recorder
from tests.fixtures.ledger import ANVIL_KEY_0, REPO, Anvil

pytestmark = [pytest.mark.anyio, pytest.mark.evm]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def round_of(node: LocalAccount, r: int, n: int = 3, **kw) -> RoundCommitment:
    return RoundCommitment(node.address, r, r, [os.urandom(32) for _ in range(n)], **kw)


@pytest.fixture
async def embedded() -> EvmLedger:
    chain = embedded_chain()
    relayer = Account.create()
    await fund(chain, relayer.address)
    return await deploy_ledger(chain, relayer, "recorder-test", relayer=relayer)


async def test_recorder_lands_every_round_in_order(embedded: EvmLedger, tmp_path: Path):
    node = Account.create()
    commitments = [round_of(node, r) for r in (0, 1, 3, 8)]
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, node, metadata="model:x") as rec:
            assert rec.state is ActorState.RUNNING
            for c in commitments:
                assert await rec.record(c)
            await rec.wait_idle(60)
            stats = rec.statistics()
            assert (stats.pending, stats.landed, stats.failed) == (0, 4, 0)
        assert rec.state is ActorState.STOPPED
        for c in commitments:
            entry = journal.entry(node.address, c.round)
            assert entry is not None
            assert entry.state is EntryState.LANDED
            assert entry.tx_hash is not None
            stored = await embedded.commitment_of(node.address, c.round)
            assert stored is not None
            assert stored.matches(c.payload())
    assert await embedded.rounds_of(node.address) == [0, 1, 3, 8]
    assert (await embedded.node_stats(node.address)).metadata == "model:x"


class GatedLedger:
    """Test seam: the real ledger, but submits wait for a gate (the chain being slow)."""

    def __init__(self, inner: EvmLedger) -> None:
        self.inner = inner
        self.gate = anyio.Event()
        self.submits = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def submit(self, node: LocalAccount, payload: CommitmentPayload) -> SubmitReceipt:
        await self.gate.wait()
        self.submits += 1
        return await self.inner.submit(node, payload)

    async def submit_many(
        self, node: LocalAccount, payloads: list[CommitmentPayload]
    ) -> list[SubmitReceipt | LedgerError]:
        await self.gate.wait()
        outcomes = await self.inner.submit_many(node, payloads)
        self.submits += len(outcomes)
        return outcomes


async def test_record_never_waits_for_the_chain(embedded: EvmLedger, tmp_path: Path):
    node = Account.create()
    gated = GatedLedger(embedded)
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(gated, journal, node) as rec:  # type: ignore[arg-type]
            with anyio.fail_after(5):  # the chain is blocked; journaling must not be
                for r in range(5):
                    await rec.record(round_of(node, r))
            assert rec.statistics().pending == 5
            assert gated.submits == 0
            gated.gate.set()
            await rec.wait_idle(60)
    assert gated.submits == 5


async def test_round_already_on_chain_is_marked_landed_not_resent(
    embedded: EvmLedger, tmp_path: Path
):
    node = Account.create()
    c = round_of(node, 2)
    await embedded.register(node)
    await embedded.submit(node, c.payload())  # landed, but the process "died" before journaling it
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, node) as rec:
            await rec.record(c)
            entry = await rec.wait_settled(2, 60)
            assert entry.state is EntryState.LANDED
            assert entry.tx_hash is None  # found on chain, not sent again
            assert rec.statistics().send_failures == 0
    assert len(await embedded.commitments(node.address)) == 1


async def test_conflicting_and_superseded_rounds_are_marked_failed(
    embedded: EvmLedger, tmp_path: Path
):
    node = Account.create()
    await embedded.register(node)
    await embedded.submit(node, round_of(node, 2).payload())
    await embedded.submit(node, round_of(node, 5).payload())
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, node) as rec:
            await rec.record(round_of(node, 2))  # chain holds another round 2
            await rec.record(round_of(node, 4))  # round 5 is on chain: 4 can never land
            await rec.record(round_of(node, 6))
            await rec.wait_idle(60)
        states = {e.round: (e.state, e.last_error) for e in journal.entries()}
    assert states[2][0] is EntryState.FAILED
    assert "conflict" in (states[2][1] or "")
    assert states[4][0] is EntryState.FAILED
    assert "superseded" in (states[4][1] or "")
    assert states[6][0] is EntryState.LANDED


class FlakyLedger:
    """Test seam: the real ledger behind an endpoint that fails the first ``n`` calls."""

    def __init__(self, inner: EvmLedger, failures: int) -> None:
        self.inner = inner
        self.left = failures

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        async def call(*args, **kwargs):
            if self.left > 0:
                self.left -= 1
                raise LedgerUnavailable("endpoint down (test)")
            return await attr(*args, **kwargs)

        return call


async def test_recorder_retries_with_backoff_until_the_chain_answers(
    embedded: EvmLedger, tmp_path: Path
):
    node = Account.create()
    flaky = FlakyLedger(embedded, failures=4)
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(flaky, journal, node, retry_base_s=0.01, retry_max_s=0.05) as rec:  # type: ignore[arg-type]
            await rec.record(round_of(node, 1))
            entry = await rec.wait_settled(1, 60)
            assert entry.state is EntryState.LANDED
            assert entry.attempts == 4
            assert rec.statistics().send_failures == 4


async def test_stopped_recorder_refuses_work_and_wrong_node_is_rejected(
    embedded: EvmLedger, tmp_path: Path
):
    node, other = Account.create(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, node) as rec:
            with pytest.raises(RejectedInput):
                await rec.record(round_of(other, 1))
        with pytest.raises(ActorStopped):
            await rec.record(round_of(node, 1))
        await rec.aclose()  # idempotent


@pytest.mark.anvil
@pytest.mark.timeout(240)
async def test_journaled_commitments_land_once_after_the_rpc_returns(anvil: Anvil, tmp_path: Path):
    relayer = Account.from_key(ANVIL_KEY_0)
    ledger = await deploy_ledger(
        rpc_chain(anvil.url, timeout_s=2), relayer, "fault", relayer=relayer
    )
    node = Account.create()
    commitments = [round_of(node, r) for r in range(6)]
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node, retry_base_s=0.05, retry_max_s=0.3) as rec:
            await rec.record(commitments[0])
            await rec.wait_idle(60)
            anvil.stop()  # the endpoint goes away (state dumped to disk)
            for c in commitments[1:]:
                await rec.record(c)
            with anyio.fail_after(60):
                while rec.statistics().send_failures < 2:
                    await anyio.sleep(0.05)
            assert rec.statistics().pending == 5
            anvil.start()  # back, with its state
            await rec.wait_idle(120)
            assert rec.statistics().landed == 6
    assert await ledger.rounds_of(node.address) == list(range(6))
    events = await ledger.commitments(node.address)
    assert [e.round for e in events] == list(range(6))  # each exactly once
    for c in commitments:
        stored = await ledger.commitment_of(node.address, c.round)
        assert stored is not None
        assert stored.matches(c.payload())


@pytest.mark.anvil
@pytest.mark.timeout(240)
@pytest.mark.parametrize("chain_up", [False, True], ids=["chain-down", "chain-up"])
async def test_commitments_pending_at_a_crash_land_after_restart(
    anvil: Anvil, tmp_path: Path, chain_up: bool
):
    relayer = Account.from_key(ANVIL_KEY_0)
    ledger = await deploy_ledger(
        rpc_chain(anvil.url, timeout_s=2), relayer, "crash", relayer=relayer
    )
    node = Account.create()
    if not chain_up:
        anvil.stop()  # the child journals while the chain is away, so nothing can land
    # chain up: the child is killed while it is sending, so some rounds may have landed
    # (maybe without their receipt journaled) and the rest are pending.
    journal_path = tmp_path / "journal.sqlite"
    env = os.environ | {
        "SAPO_TEST_NODE_KEY": node.key.hex(),
        "SAPO_TEST_RELAYER_KEY": ANVIL_KEY_0,
        "PYTHONPATH": str(REPO),
    }
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("ledger_recorder_child.py")),
            anvil.url,
            ledger.address,
            str(journal_path),
            "4",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        line = await anyio.to_thread.run_sync(child.stdout.readline)
        assert line.strip() == b"journaled 4"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    if not chain_up:
        anvil.start()
    with Journal(journal_path) as journal:
        assert len(journal.entries(node.address)) == 4
        if not chain_up:
            assert len(journal.pending(node.address)) == 4
        async with Recorder(ledger, journal, node, retry_base_s=0.05, retry_max_s=0.3) as rec:
            await rec.wait_idle(120)
            assert rec.statistics().landed == 4
    assert await ledger.rounds_of(node.address) == [0, 1, 2, 3]
    assert [e.round for e in await ledger.commitments(node.address)] == [0, 1, 2, 3]


async def test_open_embedded_ledger_serves_unfunded_nodes(tmp_path: Path):
    ledger = await open_embedded_ledger("quickstart")
    node = Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node) as rec:
            await rec.record(round_of(node, 0))
            assert (await rec.wait_settled(0, 60)).state is EntryState.LANDED
    assert ledger.chain.w3.eth.get_balance(node.address) == 0


async def test_consumer_round_lands_before_its_producer_round_and_credit_follows(
    embedded: EvmLedger, tmp_path: Path
):
    # Before: the consumer's round was refused (SapoLedgerProducerRoundNotCommitted) and
    # retried until the producer's landed, so every node's chain writes waited on its peers'.
    consumer, producer = Account.create(), Account.create()
    shared = [os.urandom(32) for _ in range(2)]
    used = round_of(consumer, 1, external_hashes={producer.address: {4: shared}})
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, consumer, retry_base_s=0.05, retry_max_s=0.2) as rec:
            await rec.record(used)
            entry = await rec.wait_settled(1, 60)
            assert entry.state is EntryState.LANDED
            assert rec.statistics().send_failures == 0
            assert rec.statistics().claims_open == 1
            assert await embedded.credit_received(producer.address) == 0
            async with Recorder(embedded, journal, producer) as prec:
                await prec.record(RoundCommitment(producer.address, 4, 4, shared))
                await prec.wait_idle(60)
            await rec.wait_credit_settled(60)
            stats = rec.statistics()
            assert (stats.claims_open, stats.claims_settled, stats.send_failures) == (1 - 1, 1, 0)
    assert await embedded.credit_received(producer.address) == 2
    assert await embedded.claim_of(consumer.address, 1, producer.address, 4) == 0


async def test_a_producer_round_that_never_lands_withdraws_nothing(
    embedded: EvmLedger, tmp_path: Path
):
    # Before: after a credit wait the ghost's usage was withdrawn from the consumer's
    # journaled commitment (its hashes left the usage root), and honest producers queued
    # behind their own backlog lost credit the same way at the final drain.
    consumer, ghost, producer = Account.create(), Account.create(), Account.create()
    real = [os.urandom(32) for _ in range(2)]
    ghostly = [os.urandom(32)]
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, producer) as prec:
            await prec.record(RoundCommitment(producer.address, 0, 0, real))
            await prec.wait_idle(60)
        mixed = round_of(
            consumer,
            1,
            external_hashes={ghost.address: {0: ghostly}, producer.address: {0: real}},
        )
        async with Recorder(embedded, journal, consumer, retry_base_s=0.05, retry_max_s=0.2) as rec:
            await rec.record(mixed)
            await rec.record(round_of(consumer, 2))
            landed = await rec.wait_settled(1, 60)
            assert landed.state is EntryState.LANDED
            assert (await rec.wait_settled(2, 60)).state is EntryState.LANDED
            await rec.wait_credit_settled(60)
            assert rec.statistics().send_failures == 0
            assert (rec.statistics().claims_open, rec.statistics().claims_settled) == (1, 0)
        # The journal holds what was trained on, the ghost's usage included.
        assert landed.commitment == mixed
        assert [loc.node for loc in journal.find_rollout(ghostly[0])] == [consumer.address]
    assert await embedded.rounds_of(consumer.address) == [1, 2]
    assert await embedded.credit_received(producer.address) == 2
    assert await embedded.credit_received(ghost.address) == 0
    assert await embedded.claim_of(consumer.address, 1, ghost.address, 0) == 1


async def test_usage_its_producer_round_refuses_is_dropped_not_the_consumer_round(
    embedded: EvmLedger, tmp_path: Path
):
    # Seen in the 12 s block chaos run (a round lost): a publish the server acked while its
    # producer saw it fail is in the stream and trained on, but the producer's commitment
    # for that round does not count it. The chain refuses crediting more than the round
    # shared, which marked the consumer's whole round failed.
    consumer, producer = Account.create(), Account.create()
    counted, uncounted = os.urandom(32), os.urandom(32)
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(embedded, journal, producer) as prec:
            await prec.record(RoundCommitment(producer.address, 0, 0, [counted]))
            await prec.wait_idle(60)
        used = round_of(consumer, 1, external_hashes={producer.address: {0: [counted, uncounted]}})
        async with Recorder(embedded, journal, consumer, retry_base_s=0.05, retry_max_s=0.2) as rec:
            await rec.record(used)
            await rec.record(round_of(consumer, 2))
            assert (await rec.wait_settled(1, 60)).state is EntryState.LANDED
            assert (await rec.wait_settled(2, 60)).state is EntryState.LANDED
    assert await embedded.rounds_of(consumer.address) == [1, 2]
    assert await embedded.credit_received(producer.address) == 0


class StuckBacklogLedger:
    """Test seam: the real ledger, but commitments from ``stuck_from`` on never land (a
    node whose backlog is never empty, as a fast node's is at a 12 s block time)."""

    def __init__(self, inner: EvmLedger, stuck_from: int) -> None:
        self.inner = inner
        self.stuck_from = stuck_from

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def submit_many(
        self, node: LocalAccount, payloads: list[CommitmentPayload]
    ) -> list[SubmitReceipt | LedgerError]:
        if payloads[0].round >= self.stuck_from:
            raise LedgerUnavailable("the batch is still waiting for its block")
        return await self.inner.submit_many(node, payloads)


async def test_claims_settle_while_the_nodes_own_backlog_never_empties(
    embedded: EvmLedger, tmp_path: Path
):
    # Commitments go first, but a node that always has one pending settled its claims only
    # when it stopped (4-node chaos run at 12 s blocks: 11 settled while running).
    consumer, producer = Account.create(), Account.create()
    shared = {r: [os.urandom(32) for _ in range(2)] for r in range(3)}
    stuck = StuckBacklogLedger(embedded, stuck_from=3)
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(
            stuck,  # type: ignore[arg-type]
            journal,
            consumer,
            retry_base_s=0.05,
            retry_max_s=0.2,
            settle_defer_s=0.5,
        ) as rec:
            for r in range(3):
                external = {producer.address: {r: shared[r]}}
                await rec.record(round_of(consumer, r, external_hashes=external))
            await rec.wait_idle(60)
            assert rec.statistics().claims_open == 3
            await rec.record(round_of(consumer, 3))  # from here on, always one pending
            async with Recorder(embedded, journal, producer) as prec:
                for r in range(3):
                    await prec.record(RoundCommitment(producer.address, r, r, shared[r]))
                await prec.wait_idle(60)
            with anyio.fail_after(30):
                while rec.statistics().claims_open:  # a chain condition, polled
                    await anyio.sleep(0.05)
            assert rec.statistics().pending == 1
    assert await embedded.credit_received(producer.address) == 6
