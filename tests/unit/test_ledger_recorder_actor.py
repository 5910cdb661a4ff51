"""The Recorder as an actor, on the memory ledger: life cycle, drain, failure, off-loop writes.

The chain-facing behaviour (exactly-once, retries, crash and restart against eth-tester and
anvil) is in tests/integration/test_ledger_recorder.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.actors import ActorState
from sapo_async.errors import ActorFailed, ActorStopped, CommitmentRejected
from sapo_async.ledger import MemoryLedger, OnChainCommitment, RoundCommitment
from sapo_async.ledger.chain import reverted
from sapo_async.ledger.journal import ClaimState, EntryState, Journal
from sapo_async.ledger.recorder import Recorder
from tests.fixtures.ledger import SlowFsyncJournal

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_leaks")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def round_of(node: LocalAccount, r: int) -> RoundCommitment:
    return RoundCommitment(node.address, r, r, [os.urandom(32) for _ in range(2)])


def relayed() -> MemoryLedger:
    return MemoryLedger("recorder", relayer=Account.create())


async def test_closing_the_recorder_lands_what_is_pending_first(tmp_path: Path):
    ledger, node = relayed(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node) as rec:
            for r in (1, 2, 5):
                assert await rec.record(round_of(node, r))
        assert rec.state is ActorState.STOPPED
        assert [e.state for e in journal.entries()] == [EntryState.LANDED] * 3
    assert await ledger.rounds_of(node.address) == [1, 2, 5]


async def test_record_returns_once_durable_and_the_loop_runs_during_the_fsync(tmp_path: Path):
    ledger, node = relayed(), Account.create()
    with SlowFsyncJournal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node) as rec, anyio.create_task_group() as tg:
            recorded = anyio.Event()

            async def record() -> None:
                await rec.record(round_of(node, 1))
                recorded.set()

            tg.start_soon(record)
            assert await anyio.to_thread.run_sync(journal.syncing.wait, 10)
            assert not recorded.is_set()  # held in its fsync, while this task runs
            assert rec.statistics().pending == 0  # not durable yet, so not counted
            journal.release.set()
            with anyio.fail_after(10):
                await recorded.wait()
            assert journal.entry(node.address, 1) is not None
            await rec.wait_idle(10)
    assert await ledger.rounds_of(node.address) == [1]


async def test_a_recorder_resumes_entries_a_previous_one_left_pending(tmp_path: Path):
    ledger, node = relayed(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        journal.append(round_of(node, 3))  # journaled by a process that died before sending
        async with Recorder(ledger, journal, node) as rec:
            assert (await rec.wait_settled(3, 10)).state is EntryState.LANDED
    assert await ledger.rounds_of(node.address) == [3]


class BrokenLedger(MemoryLedger):
    """A ledger with a bug (not a ledger failure): the recorder must not retry it forever."""

    async def commitment_of(self, node: str, round_: int) -> OnChainCommitment | None:
        raise ZeroDivisionError("bug in the ledger adapter")


async def test_a_bug_in_the_sender_fails_the_recorder_visibly(tmp_path: Path):
    node = Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        rec = Recorder(BrokenLedger(), journal, node)
        with pytest.raises(ExceptionGroup) as caught:  # noqa: PT012 - the failure arrives mid-block
            async with rec:
                await rec.record(round_of(node, 1))
                with anyio.fail_after(10):
                    await rec.wait_stopped()
        (failure,) = caught.value.exceptions
        assert isinstance(failure, ActorFailed)
        assert isinstance(failure.__cause__, ZeroDivisionError)
        assert rec.state is ActorState.FAILED
        with pytest.raises(ActorStopped):
            await rec.record(round_of(node, 2))
        assert [e.state for e in journal.entries()] == [EntryState.PENDING]  # kept for later


async def test_stopping_twice_or_before_starting_is_harmless(tmp_path: Path):
    with Journal(tmp_path / "j.sqlite") as journal:
        never_started = Recorder(relayed(), journal, Account.create())
        await never_started.aclose()
        assert never_started.state is ActorState.STOPPED
        rec = Recorder(relayed(), journal, Account.create())
        async with rec:
            await rec.aclose()
            await rec.aclose()
        assert rec.state is ActorState.STOPPED


class BlindRevertLedger(MemoryLedger):
    """Reverts the first submit of every round as a mined transaction does on anvil when the
    state moved after the gas estimate: no reason attached."""

    def __init__(self) -> None:
        super().__init__("recorder", relayer=Account.create())
        self.blind: set[int] = set()

    async def submit(self, node, payload):  # type: ignore[no-untyped-def]
        if payload.round not in self.blind:
            self.blind.add(payload.round)
            raise CommitmentRejected("transaction 0xab reverted", tx_hash="0xab")
        return await super().submit(node, payload)


async def test_a_revert_without_a_reason_is_resent_not_lost(tmp_path: Path):
    ledger, node = BlindRevertLedger(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node, retry_base_s=0.01, retry_max_s=0.02) as rec:
            assert await rec.record(round_of(node, 1))
            assert (await rec.wait_settled(1, 10)).state is EntryState.LANDED
    assert await ledger.rounds_of(node.address) == [1]


async def test_waiting_for_credit_on_an_idle_recorder_does_not_wait_out_its_idle_interval(
    tmp_path: Path,
):
    """Two settle passes are awaited; an idle sender ran the second only after its idle
    interval (retry_max_s), so every node leaving a quick async table waited ~30 s."""
    ledger, node = relayed(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node, retry_max_s=60.0) as rec:
            assert await rec.record(round_of(node, 1))
            await rec.wait_idle(10)
            with anyio.fail_after(5):
                await rec.wait_credit_settled(60)


class RacingLedger(BlindRevertLedger):
    """Reverts every round's first ``races`` sends without a reason, as anvil does to a
    consumer's commitment whose gas was estimated before a producer round it credits landed
    earlier in the same block (the credit costs more gas than the claim it was estimated as)."""

    def __init__(self, races: int) -> None:
        super().__init__()
        self.races = races
        self.sends: dict[int, int] = {}

    async def submit(self, node, payload):  # type: ignore[no-untyped-def]
        self.sends[payload.round] = self.sends.get(payload.round, 0) + 1
        if self.sends[payload.round] <= self.races:
            raise CommitmentRejected("transaction 0xab reverted", tx_hash="0xab")
        return await MemoryLedger.submit(self, node, payload)


async def test_a_commitment_reverted_by_races_many_times_is_retried_until_it_lands(
    tmp_path: Path,
):
    """The 12 s block chaos run lost round 2 of a node this way (journaled, then failed):
    a revert without a reason is never a verdict; only a refusal the chain names is."""
    ledger, node = RacingLedger(races=6), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node, retry_base_s=0.01, retry_max_s=0.02) as rec:
            assert await rec.record(round_of(node, 2))
            entry = await rec.wait_settled(2, 10)
        assert entry.state is EntryState.LANDED
        assert entry.attempts == 6  # every failed send journaled with its error
    assert ledger.sends[2] == 7
    assert await ledger.rounds_of(node.address) == [2]


class MempoolLedger(MemoryLedger):
    """Refuses each round's first send as not increasing while nothing is stored for it: what
    a simulation against the pending block says when the round's own earlier transaction (a
    previous process's, or one whose receipt wait was cut short) waits in the mempool."""

    def __init__(self) -> None:
        super().__init__("recorder", relayer=Account.create())
        self.refused: set[int] = set()

    async def submit(self, node, payload):  # type: ignore[no-untyped-def]
        if payload.round not in self.refused:
            self.refused.add(payload.round)
            raise reverted("SapoLedgerRoundNotIncreasing", round=payload.round)
        return await super().submit(node, payload)


async def test_a_round_refused_for_its_own_waiting_transaction_is_not_marked_superseded(
    tmp_path: Path,
):
    ledger, node = MempoolLedger(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, node, retry_base_s=0.01, retry_max_s=0.02) as rec:
            assert await rec.record(round_of(node, 4))
            entry = await rec.wait_settled(4, 10)
    assert entry.state is EntryState.LANDED, entry.last_error
    assert await ledger.rounds_of(node.address) == [4]


class BatchRevertLedger(MemoryLedger):
    """A node's own ledger (no relayer) on which every batch of more than one commitment is
    mined and reverts without a reason, while a commitment alone lands: the worst case of a
    round that keeps breaking the batches it is in."""

    def __init__(self) -> None:
        super().__init__("recorder")
        self.batches: list[int] = []

    async def submit_batch(self, node, payloads):  # type: ignore[no-untyped-def]
        self.batches.append(len(payloads))
        if len(payloads) > 1:
            raise CommitmentRejected("transaction 0xab reverted", tx_hash="0xab")
        return await super().submit_batch(node, payloads)


async def test_rounds_go_alone_after_their_batch_reverted_without_a_reason(tmp_path: Path):
    ledger, node = BatchRevertLedger(), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        for r in (1, 2, 3):  # a backlog left by a previous process
            journal.append(round_of(node, r))
        async with Recorder(ledger, journal, node, retry_base_s=0.01, retry_max_s=0.02) as rec:
            await rec.wait_idle(10)
            assert rec.statistics().failed == 0
    assert await ledger.rounds_of(node.address) == [1, 2, 3]
    assert ledger.batches[:2] == [3, 1]  # the batch reverted, its first round went alone


async def test_a_direct_backlog_lands_as_one_batch_on_the_memory_ledger(tmp_path: Path):
    ledger, node = MemoryLedger("recorder"), Account.create()
    with Journal(tmp_path / "j.sqlite") as journal:
        for r in range(5):
            journal.append(round_of(node, r))
        async with Recorder(ledger, journal, node) as rec:
            await rec.wait_idle(10)
        blocks = {e.block_number for e in journal.entries(node.address)}
    assert len(blocks) == 1
    assert await ledger.rounds_of(node.address) == list(range(5))


class ReadCountingLedger(MemoryLedger):
    """Counts the views a settle pass reads (test seam: the memory ledger's rules)."""

    reads = 0

    async def claim_of(self, *key):  # type: ignore[no-untyped-def]
        self.reads += 1
        return await super().claim_of(*key)

    async def commitment_of(self, node: str, round_: int) -> OnChainCommitment | None:
        self.reads += 1
        return await super().commitment_of(node, round_)

    async def node_stats(self, node: str):  # type: ignore[no-untyped-def]
        self.reads += 1
        return await super().node_stats(node)


async def land_claiming(
    ledger: MemoryLedger,
    journal: Journal,
    node: LocalAccount,
    producer: LocalAccount,
    rounds: range | tuple[int, ...],
) -> None:
    """Land ``node``'s ``rounds``, each claiming one rollout of ``producer``'s same round
    (not on chain yet), and journal them landed with their claims."""
    for r in rounds:
        used = {producer.address: {r: [os.urandom(32)]}}
        c = RoundCommitment(node.address, r, r, [os.urandom(32)], used)
        receipt = await ledger.submit(node, c.payload())
        journal.append(c)
        journal.mark_landed(node.address, r, tx_hash=None, block_number=1, claimed=receipt.claimed)


async def land_own(ledger: MemoryLedger, producer: LocalAccount, rounds: range | tuple[int, ...]):
    """Land ``producer``'s own ``rounds`` (no claims)."""
    for r in rounds:
        await ledger.submit(
            producer, RoundCommitment(producer.address, r, r, [os.urandom(32)]).payload()
        )


async def test_a_settle_pass_reads_the_chain_once_per_producer_not_per_claim(tmp_path: Path):
    # Two views per open claim per pass held the embedded chain's one lock for tens of seconds
    # on a busy node (README swarm: 30-round backlogs, a round 116 s from journal to chain).
    ledger, node, producer = ReadCountingLedger("recorder"), Account.create(), Account.create()
    await ledger.register(node)
    await ledger.register(producer)
    claims = 40
    with Journal(tmp_path / "j.sqlite") as journal:
        await land_claiming(ledger, journal, node, producer, range(claims))
        await land_own(ledger, producer, range(claims // 2))  # then half of them land
        async with Recorder(ledger, journal, node) as rec:
            rec_stats = rec.statistics()
            assert rec_stats.claims_open == claims
            ledger.reads, before = 0, rec._settler.passes
            await rec.wait_credit_settled(30)
            passes = rec._settler.passes - before + 1  # the pass under way when reads were reset
            stats = rec.statistics()
    assert (stats.claims_settled, stats.claims_open) == (claims // 2, claims // 2)
    assert await ledger.credit_received(producer.address) == claims // 2
    assert ledger.reads <= passes  # one producer: one read a pass, whatever the claims


class SettleCountingLedger(MemoryLedger):
    """Counts settlement transactions (test seam: the memory ledger's rules)."""

    batches: list[int]
    singles = 0

    async def settle_credits(self, sender, claims):  # type: ignore[no-untyped-def]
        self.batches.append(len(claims))
        return await super().settle_credits(sender, claims)

    async def settle_credit(self, sender, *key):  # type: ignore[no-untyped-def]
        self.singles += 1
        return await super().settle_credit(sender, *key)


async def test_a_claim_settled_by_someone_else_does_not_split_the_batch_into_one_per_claim(
    tmp_path: Path,
):
    # A batch refused for one claim went one transaction per claim: at 12 s blocks the
    # 8-node chaos run's final drain outlasted 600 s.
    ledger, node, producer = SettleCountingLedger("recorder"), Account.create(), Account.create()
    ledger.batches = []
    await ledger.register(node)
    await ledger.register(producer)
    with Journal(tmp_path / "j.sqlite") as journal:
        await land_claiming(ledger, journal, node, producer, range(5))
        await land_own(ledger, producer, range(5))
        await ledger.settle_credit(producer, node.address, 2, producer.address, 2)  # anyone may
        ledger.singles, ledger.batches = 0, []
        async with Recorder(ledger, journal, node) as rec:
            await rec.wait_credit_settled(30)
            stats = rec.statistics()
    assert (stats.claims_settled, stats.claims_open) == (5, 0)
    assert ledger.batches == [5, 4]  # refused for the settled claim, then the rest at once
    assert ledger.singles == 0
    assert await ledger.credit_received(producer.address) == 5


async def test_claims_on_producer_rounds_that_were_skipped_lapse_instead_of_staying_open(
    tmp_path: Path,
):
    # Two claims on rounds the producer skipped (its later round landed) made every batch of
    # them refused, read and dropped for the pass, and never closed: open forever.
    ledger, node, producer = MemoryLedger("recorder"), Account.create(), Account.create()
    await ledger.register(node)
    await ledger.register(producer)
    with Journal(tmp_path / "j.sqlite") as journal:
        await land_claiming(ledger, journal, node, producer, (3, 4, 5))
        await land_own(ledger, producer, (5,))  # 3 and 4 skipped
        async with Recorder(ledger, journal, node) as rec:
            await rec.wait_credit_settled(30)
            stats = rec.statistics()
        states = journal.claim_counts(node.address)
    assert (stats.claims_settled, stats.claims_open) == (1, 0)
    assert states[ClaimState.LAPSED] == 2
    assert await ledger.credit_received(producer.address) == 1
