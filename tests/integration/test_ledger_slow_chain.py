"""The recorder on a chain that mines on a clock (a real chain's block time), on anvil.

Anvil's automine is switched off once the ledger is deployed and the nodes registered, and the
test mines each block itself (``evm_mine``), so what lands in which block is decided by the
test, not by a clock: no test here sleeps or depends on the machine's speed.

- a consumer commitment sent while the producer round it credits waits in the same block
  lands with it (the 12 s block chaos run lost a round to this race: its gas was estimated as
  a claim, it ran out of gas as a credit, and the revert carried no reason);
- a node's backlog goes out as one ``commitMany`` transaction and lands in one block; a round
  refused inside it holds back neither the rounds before it (they land as a smaller batch) nor
  those after it (they follow once the refused one is dealt with);
- commitments a previous process sent that are still waiting in the mempool are neither
  marked failed nor sent twice: they land once, when their block comes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.ledger import EvmLedger, RoundCommitment, deploy_ledger, fund, rpc_chain
from sapo_async.ledger.journal import EntryState, Journal
from sapo_async.ledger.recorder import Recorder
from tests.fixtures.ledger import ANVIL_KEY_0, Anvil

pytestmark = [pytest.mark.anyio, pytest.mark.evm, pytest.mark.anvil, pytest.mark.timeout(180)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _rpc(ledger: EvmLedger, method: str, *params: Any) -> Any:
    return ledger.chain.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]


async def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Poll ``condition`` (a chain read) until it holds; a real condition, not a delay."""
    try:
        with anyio.fail_after(timeout_s):
            while not await anyio.to_thread.run_sync(condition):
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not {what} within {timeout_s} s") from None


def _in_mempool(ledger: EvmLedger, address: str) -> int:
    eth = ledger.chain.w3.eth
    return eth.get_transaction_count(address, "pending") - eth.get_transaction_count(  # type: ignore[arg-type]
        address, "latest"
    )


async def _manual_chain(anvil: Anvil, *nodes: LocalAccount) -> EvmLedger:
    ledger = await deploy_ledger(rpc_chain(anvil.url), Account.from_key(ANVIL_KEY_0), "slow")
    for node in nodes:
        await fund(ledger.chain, node.address)
        await ledger.register(node, "")
    _rpc(ledger, "evm_setAutomine", False)  # from here on, a block only when the test mines
    return ledger


def _commit_raw(ledger: EvmLedger, node: LocalAccount, commitment: RoundCommitment) -> None:
    """Send ``node``'s commitment without waiting for it: a process that died after sending."""
    w3 = ledger.chain.w3
    call = ledger._contract.functions.commit(commitment.payload().as_abi())
    tx = call.build_transaction(
        {"from": node.address, "nonce": w3.eth.get_transaction_count(node.address, "pending")}
    )
    w3.eth.send_raw_transaction(node.sign_transaction(tx).raw_transaction)


async def test_a_commitment_crediting_a_round_landing_in_its_block_does_not_revert(
    anvil: Anvil, tmp_path: Path
):
    producer, consumer = Account.create(), Account.create()
    ledger = await _manual_chain(anvil, producer, consumer)
    shared = [os.urandom(32) for _ in range(4)]
    _commit_raw(ledger, producer, RoundCommitment(producer.address, 0, 0, shared))
    used = RoundCommitment(
        consumer.address, 0, 0, [os.urandom(32)], {producer.address: {0: shared[:2]}}
    )
    with Journal(tmp_path / "j.sqlite") as journal:
        async with Recorder(ledger, journal, consumer, retry_base_s=0.05) as rec:
            await rec.record(used)
            await _wait_for(lambda: _in_mempool(ledger, consumer.address) == 1, "sent")
            _rpc(ledger, "evm_mine")  # the producer's round first, then the consumer's
            entry = await rec.wait_settled(0, 30)
            assert rec.statistics().send_failures == 0, rec.statistics().last_error
        assert entry.state is EntryState.LANDED
        assert entry.attempts == 0
    producer_round = await ledger.commitment_of(producer.address, 0)
    assert producer_round is not None
    assert producer_round.block_number == entry.block_number  # the same block
    assert await ledger.credited_by(consumer.address, producer.address, 0) == 2  # at once


async def test_a_backlog_of_twenty_rounds_lands_as_one_transaction_in_one_block(
    anvil: Anvil, tmp_path: Path
):
    node = Account.create()
    ledger = await _manual_chain(anvil, node)
    rounds = [RoundCommitment(node.address, r, r, [os.urandom(32)]) for r in range(20)]
    with Journal(tmp_path / "j.sqlite") as journal:
        for c in rounds:  # a backlog, as a node left it at its last stop
            journal.append(c)
        async with Recorder(ledger, journal, node, retry_base_s=0.05) as rec:
            await _wait_for(lambda: _in_mempool(ledger, node.address) == 1, "one batch sent")
            _rpc(ledger, "evm_mine")
            await rec.wait_idle(30)
            assert rec.statistics().send_failures == 0
        entries = journal.entries(node.address)
        assert [e.state for e in entries] == [EntryState.LANDED] * 20
        assert len({(e.tx_hash, e.block_number) for e in entries}) == 1  # one transaction
    assert [e.round for e in await ledger.commitments(node.address)] == list(range(20))


async def test_a_batch_stops_before_a_refused_round_and_the_rounds_after_it_follow(
    anvil: Anvil, tmp_path: Path
):
    producer, consumer = Account.create(), Account.create()
    ledger = await _manual_chain(anvil, producer, consumer)
    shared = [os.urandom(32) for _ in range(2)]
    _commit_raw(ledger, producer, RoundCommitment(producer.address, 0, 0, shared))
    _rpc(ledger, "evm_mine")
    # Round 2 credits one rollout more than the producer's round shared: refused by name.
    usage = {1: shared[:1], 2: [*shared, os.urandom(32)], 3: shared[1:]}
    rounds = [
        RoundCommitment(consumer.address, r, r, [os.urandom(32)], {producer.address: {0: used}})
        for r, used in usage.items()
    ]
    with Journal(tmp_path / "j.sqlite") as journal:
        for c in rounds:
            journal.append(c)
        async with Recorder(ledger, journal, consumer, retry_base_s=0.05) as rec:
            await _wait_for(lambda: _in_mempool(ledger, consumer.address) == 1, "round 1 sent")
            _rpc(ledger, "evm_mine")  # round 1 alone: round 2 was refused by its simulation
            await _wait_for(lambda: _in_mempool(ledger, consumer.address) == 1, "the rest sent")
            _rpc(ledger, "evm_mine")  # round 2 without the refused usage, and round 3, together
            await rec.wait_idle(30)
        entries = journal.entries(consumer.address)
    assert [e.state for e in entries] == [EntryState.LANDED] * 3
    assert entries[1].block_number == entries[2].block_number != entries[0].block_number
    assert await ledger.credited_by(consumer.address, producer.address, 0) == 2


async def test_rounds_a_dead_process_left_in_the_mempool_land_once_and_none_fails(
    anvil: Anvil, tmp_path: Path
):
    node = Account.create()
    ledger = await _manual_chain(anvil, node)
    rounds = [RoundCommitment(node.address, r, r, [os.urandom(32)]) for r in range(3)]
    with Journal(tmp_path / "j.sqlite") as journal:
        for c in rounds:
            journal.append(c)
            _commit_raw(ledger, node, c)  # sent, then the process died before any receipt
        journal.append(RoundCommitment(node.address, 3, 3, [os.urandom(32)]))  # never sent
        async with Recorder(ledger, journal, node, retry_base_s=0.05, retry_max_s=0.2) as rec:
            # The new process's simulation against the pending block finds round 0 taken by
            # its own waiting transaction: it must wait for it, neither resend nor give up.
            await _wait_for(lambda: rec.statistics().send_failures >= 2, "refused while pending")
            assert rec.statistics().failed == 0
            assert _in_mempool(ledger, node.address) == 3  # nothing sent twice
            _rpc(ledger, "evm_mine")
            await _wait_for(lambda: _in_mempool(ledger, node.address) == 1, "round 3 sent")
            _rpc(ledger, "evm_mine")
            await rec.wait_idle(30)
        states = [e.state for e in journal.entries(node.address)]
    assert states == [EntryState.LANDED] * 4
    assert [e.round for e in await ledger.commitments(node.address)] == [0, 1, 2, 3]


async def test_open_credit_claims_go_out_together_and_settle_in_one_block(
    anvil: Anvil, tmp_path: Path
):
    # One settleCredit per block took a consumer's hundreds of claims an hour at 12 s
    # blocks (8-node chaos run): now a pass sends them as one settleCredits transaction.
    producer, consumer = Account.create(), Account.create()
    ledger = await _manual_chain(anvil, producer, consumer)
    shared = {r: [os.urandom(32) for _ in range(3)] for r in range(4)}
    with Journal(tmp_path / "j.sqlite") as journal:
        for r in range(4):  # each round used 2 rollouts of a producer round not on chain
            used = {producer.address: {r: shared[r][:2]}}
            journal.append(RoundCommitment(consumer.address, r, r, [os.urandom(32)], used))
        async with Recorder(ledger, journal, consumer, retry_base_s=0.05) as rec:
            await _wait_for(lambda: _in_mempool(ledger, consumer.address) == 1, "rounds sent")
            _rpc(ledger, "evm_mine")
            await rec.wait_idle(30)
            assert len(journal.open_claims(consumer.address)) == 4
            for r in range(4):
                _commit_raw(ledger, producer, RoundCommitment(producer.address, r, r, shared[r]))
            _rpc(ledger, "evm_mine")  # the producer rounds land; the claims can settle
            await _wait_for(lambda: _in_mempool(ledger, consumer.address) == 1, "claims sent")
            _rpc(ledger, "evm_mine")
            await _wait_for(lambda: not journal.open_claims(consumer.address), "claims settled")
            assert rec.statistics().send_failures == 0, rec.statistics().last_error
    for r in range(4):
        assert await ledger.credited_by(consumer.address, producer.address, r) == 2
        assert await ledger.claim_of(consumer.address, r, producer.address, r) == 0
    assert (await ledger.node_stats(producer.address)).credit_received == 8
