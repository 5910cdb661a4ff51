"""The batch part of the ledger conformance suite (``submit_batch``, ``commitMany``), run
against memory, eth-tester and anvil like tests/integration/test_ledger_conformance.py,
which holds the batch's atomicity and ``submit_many``'s prefix: here, what each round of a
batch gets back, the batch's length bounds, and relayed ledgers.
"""

from __future__ import annotations

import pytest
from eth_account import Account

from sapo_async.errors import CommitmentRejected
from sapo_async.ledger import RoundCommitment
from sapo_async.ledger.types import MAX_BATCH, SubmitReceipt
from tests.fixtures.ledger import LedgerBackend
from tests.integration.test_ledger_conformance import anyio_backend, hashes, relayed_ledger, share

pytestmark = [pytest.mark.anyio, pytest.mark.evm]
__all__ = ["anyio_backend"]  # the fixture, shared with the other half of the suite


async def test_a_batch_lands_every_round_in_one_transaction_with_its_own_claims(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)  # relays for the producer, not the node
    node, producer = ledger_backend.deployer, Account.create()
    shared = await share(ledger, producer, 0, 4)
    await ledger.register(node, "")
    credits = RoundCommitment(node.address, 0, 0, hashes(1), {producer.address: {0: shared[:2]}})
    claims = RoundCommitment(node.address, 1, 1, hashes(1), {producer.address: {5: hashes(3)}})
    plain = RoundCommitment(node.address, 2, 2, hashes(1))
    receipts = await ledger.submit_batch(node, [c.payload() for c in (credits, claims, plain)])
    assert len({(r.tx_hash, r.block_number) for r in receipts}) == 1
    assert [r.claimed for r in receipts] == [(), ((producer.address, 5),), ()]
    assert await ledger.rounds_of(node.address) == [0, 1, 2]
    assert await ledger.credited_by(node.address, producer.address, 0) == 2
    assert await ledger.claim_of(node.address, 1, producer.address, 5) == 3


async def test_a_batch_of_none_or_above_max_batch_is_refused_by_name(
    ledger_backend: LedgerBackend,
):
    ledger = await ledger_backend.deploy("length", relayed=False)
    node = ledger_backend.deployer
    await ledger.register(node, "")
    too_long = [
        RoundCommitment(node.address, r, r, hashes(1)).payload() for r in range(MAX_BATCH + 1)
    ]
    for batch in ([], too_long):
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit_batch(node, batch)
        assert info.value.reason == "SapoLedgerBatchLength"
    assert await ledger.rounds_of(node.address) == []
    outcomes = await ledger.submit_many(node, too_long)  # sends what one batch may carry
    assert len(outcomes) == MAX_BATCH
    assert await ledger.rounds_of(node.address) == list(range(MAX_BATCH))


async def test_a_relayed_ledger_sends_a_gasless_nodes_backlog_as_one_transaction(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    node, producer = Account.create(), Account.create()  # neither holds any ether
    shared = await share(ledger, producer, 0, 4)
    await ledger.register(node)
    nonce = await ledger.nonce(node.address)
    rounds = [
        RoundCommitment(node.address, 0, 0, hashes(1), {producer.address: {0: shared[:2]}}),
        RoundCommitment(node.address, 1, 1, hashes(1), {producer.address: {7: hashes(2)}}),
        RoundCommitment(node.address, 2, 2, hashes(1)),
    ]
    outcomes = await ledger.submit_many(node, [c.payload() for c in rounds])
    assert all(isinstance(o, SubmitReceipt) for o in outcomes), outcomes
    receipts = [o for o in outcomes if isinstance(o, SubmitReceipt)]
    assert len({(r.tx_hash, r.block_number) for r in receipts}) == 1  # one transaction
    assert [r.claimed for r in receipts] == [(), ((producer.address, 7),), ()]
    assert await ledger.rounds_of(node.address) == [0, 1, 2]
    assert await ledger.nonce(node.address) == nonce + 3  # one signature per round
    assert await ledger.credited_by(node.address, producer.address, 0) == 2


async def test_a_relayed_batch_lands_the_rounds_before_the_first_refused(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, 5, 5, hashes(1)).payload())
    rounds = [RoundCommitment(node.address, r, r, hashes(1)).payload() for r in (6, 7, 3, 8)]
    outcomes = await ledger.submit_many(node, rounds)
    assert [type(o).__name__ for o in outcomes] == [
        "SubmitReceipt",
        "SubmitReceipt",
        "CommitmentRejected",
    ]
    last = outcomes[-1]
    assert isinstance(last, CommitmentRejected)
    assert last.reason == "SapoLedgerRoundNotIncreasing"
    assert await ledger.rounds_of(node.address) == [5, 6, 7]


async def test_claims_settle_together_or_not_at_all(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node, producer = ledger_backend.deployer, Account.create()
    await ledger.register(node, "")
    usage = {1: hashes(2), 2: hashes(2), 3: hashes(3)}  # round 3 claims more than is shared
    await ledger.submit_batch(
        node,
        [
            RoundCommitment(node.address, r, r, hashes(1), {producer.address: {r: h}}).payload()
            for r, h in usage.items()
        ],
    )
    for r in usage:
        await share(ledger, producer, r, 2)
    claims = [(node.address, r, producer.address, r) for r in usage]
    with pytest.raises(CommitmentRejected) as info:
        await ledger.settle_credits(node, claims)
    assert info.value.reason == "SapoLedgerCreditExceedsShared"
    assert await ledger.claim_of(*claims[0]) == 2  # nothing of the batch was settled
    receipts = await ledger.settle_credits(node, claims[:2])
    assert len({(r.tx_hash, r.block_number) for r in receipts}) == 1
    assert (await ledger.node_stats(producer.address)).credit_received == 4
    with pytest.raises(CommitmentRejected) as info:
        await ledger.settle_credits(node, claims[:1])
    assert info.value.reason == "SapoLedgerNothingToSettle"
