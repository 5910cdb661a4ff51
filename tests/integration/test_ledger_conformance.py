"""One conformance suite for the ledger port, run against memory, eth-tester and anvil.

Every rule is tested on every backend. The memory ledger has no chain, so the one test of
what only a chain has (a relayed node's balance and gas) is parametrized over the EVM
backends alone (``EVM_BACKENDS``) instead of being skipped on memory. A batch's atomicity
and ``submit_many``'s accepted prefix are tested here; the rest of the batch part (each
round's receipt, the length bounds, relayed ledgers) is in test_ledger_conformance_batch.py.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async import limits
from sapo_async.errors import CommitmentRejected, LedgerUnavailable
from sapo_async.ledger import EvmLedger, Ledger, MemoryLedger, RoundCommitment, fund, rpc_chain
from sapo_async.ledger.merkle import MerkleTree, hash_pair, leaf_hash
from sapo_async.ledger.signing import commitment_typed_data, sign_commitment
from sapo_async.ledger.types import (
    MAX_PRODUCERS,
    MAX_ROLLOUTS_PER_ROUND,
    MAX_ROUND_STEP,
    CommitmentPayload,
    SubmitReceipt,
)
from tests.fixtures.ledger import LedgerBackend, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.evm]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def hashes(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


async def relayed_ledger(backend: LedgerBackend) -> EvmLedger | MemoryLedger:
    return await backend.deploy("conformance")


def rejection(info: pytest.ExceptionInfo[CommitmentRejected]) -> str | None:
    return info.value.reason


async def share(ledger: Ledger, node: LocalAccount, round_: int, n: int) -> list[bytes]:
    """Register ``node`` if needed and commit ``n`` own rollouts for ``round_``; return them."""
    own = hashes(n)
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, round_, round_, own).payload())
    return own


async def test_every_backend_implements_the_port(ledger_backend: LedgerBackend):
    assert isinstance(await relayed_ledger(ledger_backend), Ledger)


async def test_several_direct_commitments_land_as_one_batch_up_to_a_refused_one(
    ledger_backend: LedgerBackend,
):
    ledger = await ledger_backend.deploy("many", relayed=False)
    node = ledger_backend.deployer
    await ledger.register(node, "")
    rounds = [RoundCommitment(node.address, r, r, hashes(2)).payload() for r in (0, 1, 1, 2)]
    outcomes = await ledger.submit_many(node, rounds)
    assert len(outcomes) == 3  # round 2 is not sent after the refused repeat of round 1
    first, second, refused = outcomes
    assert isinstance(first, SubmitReceipt)
    assert isinstance(second, SubmitReceipt)
    assert (first.tx_hash, first.block_number) == (second.tx_hash, second.block_number)
    assert isinstance(refused, CommitmentRejected)
    assert refused.reason == "SapoLedgerRoundNotIncreasing"
    assert await ledger.rounds_of(node.address) == [0, 1]


async def test_a_round_refused_inside_a_batch_refuses_the_whole_batch(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)  # relays for the producer, not the node
    node, producer = ledger_backend.deployer, Account.create()
    shared = await share(ledger, producer, 0, 4)
    await ledger.register(node, "")
    await ledger.submit(node, RoundCommitment(node.address, 0, 0, hashes(1)).payload())
    repeat = [RoundCommitment(node.address, r, r, hashes(2)).payload() for r in (1, 2, 2, 3)]
    over = [  # 3 + 3 rollouts of a producer round that shared 4: the second round is refused
        RoundCommitment(node.address, r, r, hashes(1), {producer.address: {0: shared[:3]}})
        for r in (1, 2)
    ]
    cases = [(repeat, "SapoLedgerRoundNotIncreasing"), (over, "SapoLedgerCreditExceedsShared")]
    for batch, reason in cases:
        payloads = [p if isinstance(p, CommitmentPayload) else p.payload() for p in batch]
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit_batch(node, payloads)
        assert rejection(info) == reason
        stats = await ledger.node_stats(node.address)
        assert (stats.rounds_committed, stats.last_round) == (1, 0)  # nothing of the batch
    assert await ledger.rounds_of(node.address) == [0]
    assert await ledger.credited_by(node.address, producer.address, 0) == 0
    assert (await ledger.node_stats(producer.address)).credit_received == 0


async def test_register_is_idempotent_and_relayed_for_unfunded_nodes(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node: LocalAccount = Account.create()  # no funds: only a relayer can send for it
    assert await ledger.register(node, "model:tiny") is True
    assert await ledger.register(node, "model:tiny") is False
    stats = await ledger.node_stats(node.address)
    assert stats.registered
    assert stats.metadata == "model:tiny"
    assert await ledger.nodes() == [node.address]


async def test_direct_commitment_is_stored_with_totals(ledger_backend: LedgerBackend):
    ledger = await ledger_backend.deploy("direct", relayed=False)
    node = ledger_backend.deployer  # sends its own transactions
    await ledger.register(node, "")
    commitment = RoundCommitment(node.address, 4, 2, hashes(8))
    receipt = await ledger.submit(node, commitment.payload())
    stored = await ledger.commitment_of(node.address, 4)
    assert stored is not None
    assert stored.matches(commitment.payload())
    assert stored.block_number == receipt.block_number
    assert await ledger.commitment_of(node.address, 5) is None
    stats = await ledger.node_stats(node.address)
    assert (stats.rounds_committed, stats.last_round, stats.rollouts_committed) == (1, 4, 8)


async def test_repeated_or_back_filled_round_is_rejected_by_name(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, 5, 1, hashes(2)).payload())
    for round_ in (5, 3):
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit(node, RoundCommitment(node.address, round_, 1, hashes(2)).payload())
        assert rejection(info) == "SapoLedgerRoundNotIncreasing"
    assert await ledger.rounds_of(node.address) == [5]


async def test_python_eip712_digest_matches_the_contract(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node, producer = Account.create(), Account.create()
    payload = RoundCommitment(
        node.address, 9, 3, hashes(3), {producer.address: {5: hashes(2)}}
    ).payload()
    domain, types, message = commitment_typed_data(
        ledger.chain_id, ledger.address, node.address, payload, 7
    )
    signed = Account.sign_typed_data(node.key, domain, types, message)
    assert await ledger.commitment_digest(node.address, payload, 7) == bytes(signed.message_hash)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 33])
async def test_python_built_proofs_verify_on_chain(ledger_backend: LedgerBackend, n: int):
    ledger = await relayed_ledger(ledger_backend)
    node, producer = Account.create(), Account.create()
    own, external = hashes(n), await share(ledger, producer, 1, n + 1)
    commitment = RoundCommitment(node.address, 1, 1, own, {producer.address: {1: external}})
    await ledger.register(node)
    await ledger.submit(node, commitment.payload())
    tree, ext_tree = commitment.rollout_tree(), commitment.external_tree()
    for h in own:
        assert await ledger.is_rollout_included(node.address, 1, h, tree.proof(h))
    for h in external:
        assert await ledger.is_external_included(node.address, 1, h, ext_tree.proof(h))
    stranger = os.urandom(32)
    assert not await ledger.is_rollout_included(node.address, 1, stranger, tree.proof(own[0]))
    assert not await ledger.is_rollout_included(node.address, 2, own[0], tree.proof(own[0]))
    # an own rollout is not an external one
    if n > 1:
        assert not await ledger.is_external_included(node.address, 1, own[0], tree.proof(own[0]))


async def test_internal_merkle_node_is_not_accepted_as_a_rollout(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    own = hashes(4)
    tree = MerkleTree.from_hashes(own)
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, 1, 1, own).payload())
    leaves = sorted(leaf_hash(h) for h in own)
    left, right = hash_pair(leaves[0], leaves[1]), hash_pair(leaves[2], leaves[3])
    assert hash_pair(left, right) == tree.root
    # With single hashing, `left` would verify with proof [right]; the leaf re-hash stops it.
    assert not await ledger.is_rollout_included(node.address, 1, left, [right])


async def test_usage_credit_reaches_producers_and_events(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    a, b, c = Account.create(), Account.create(), Account.create()
    await ledger.register(a)
    c_shared = await share(ledger, c, 1, 5)
    await ledger.register(b)
    await ledger.submit(
        b, RoundCommitment(b.address, 1, 1, hashes(3), {c.address: {1: c_shared[:4]}}).payload()
    )
    await ledger.submit(
        a,
        RoundCommitment(
            a.address, 1, 1, hashes(2), {b.address: {1: hashes(3)}, c.address: {1: hashes(1)}}
        ).payload(),
    )
    assert (await ledger.node_stats(b.address)).credit_received == 3
    assert await ledger.credit_received(c.address) == 5
    assert (await ledger.node_stats(a.address)).external_used == 4
    credits = await ledger.usage_credits(producer=c.address)
    assert sorted((u.consumer, u.count, u.producer_round) for u in credits) == sorted(
        [(a.address, 1, 1), (b.address, 4, 1)]
    )
    assert [u.count for u in await ledger.usage_credits(consumer=b.address)] == [4]
    assert await ledger.credited_by(b.address, c.address, 1) == 4
    events = await ledger.commitments()
    assert [(e.node, e.round) for e in events] == [(c.address, 1), (b.address, 1), (a.address, 1)]


async def test_credit_rules_bound_credit_by_what_the_producer_committed(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    consumer, producer, stranger = Account.create(), Account.create(), Account.create()
    await ledger.register(consumer)
    await ledger.register(stranger)
    shared = await share(ledger, producer, 3, 2)

    async def credit(round_: int, by_producer: dict[str, dict[int, list[bytes]]]) -> str | None:
        c = RoundCommitment(consumer.address, round_, round_, [], by_producer)
        try:
            await ledger.submit(consumer, c.payload())
        except CommitmentRejected as exc:
            return exc.reason
        return None

    # More than the producer shared, at once or summed over the consumer's rounds.
    assert await credit(1, {producer.address: {3: hashes(3)}}) == "SapoLedgerCreditExceedsShared"
    assert await credit(1, {producer.address: {3: shared[:1]}}) is None
    assert await credit(2, {producer.address: {3: hashes(2)}}) == "SapoLedgerCreditExceedsShared"
    assert await credit(2, {producer.address: {3: shared[1:]}}) is None
    assert await credit(3, {producer.address: {3: hashes(1)}}) == "SapoLedgerCreditExceedsShared"
    assert await ledger.credited_by(consumer.address, producer.address, 3) == 2
    assert await ledger.credit_received(producer.address) == 2
    assert await ledger.credit_received(stranger.address) == 0
    assert await ledger.rounds_of(consumer.address) == [1, 2]


async def test_usage_of_a_round_not_on_chain_lands_as_a_claim_settled_once_it_is(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    consumer, producer, stranger = Account.create(), Account.create(), Account.create()
    await ledger.register(consumer)
    await ledger.register(stranger)
    used = hashes(2)
    # The consumer's round lands before the producer's: no commitment waits on another's.
    c = RoundCommitment(
        consumer.address, 1, 1, [], {producer.address: {4: used}, stranger.address: {3: hashes(1)}}
    )
    receipt = await ledger.submit(consumer, c.payload())
    assert set(receipt.claimed) == {(producer.address, 4), (stranger.address, 3)}
    assert await ledger.rounds_of(consumer.address) == [1]
    assert await ledger.credit_received(producer.address) == 0
    assert await ledger.claim_of(consumer.address, 1, producer.address, 4) == 2
    assert await ledger.claim_of(consumer.address, 1, stranger.address, 3) == 1

    async def settle(producer_: LocalAccount, round_: int) -> str | None:
        try:
            await ledger.settle_credit(consumer, consumer.address, 1, producer_.address, round_)
        except CommitmentRejected as exc:
            return exc.reason
        return None

    # Minted for an address that shared nothing, or a round not (yet) committed: refused.
    assert await settle(stranger, 3) == "SapoLedgerProducerRoundNotCommitted"
    assert await settle(producer, 4) == "SapoLedgerProducerRoundNotCommitted"
    await ledger.register(producer)
    await ledger.submit(producer, RoundCommitment(producer.address, 4, 4, used).payload())
    assert await settle(producer, 4) is None
    assert await settle(producer, 4) == "SapoLedgerNothingToSettle"
    assert await ledger.credit_received(producer.address) == 2
    assert await ledger.credited_by(consumer.address, producer.address, 4) == 2
    assert await ledger.claim_of(consumer.address, 1, producer.address, 4) == 0
    assert await ledger.credit_received(stranger.address) == 0
    credits = await ledger.usage_credits(producer=producer.address)
    assert [(u.consumer, u.round, u.producer_round, u.count) for u in credits] == [
        (consumer.address, 1, 4, 2)
    ]


async def test_a_settled_claim_is_bounded_by_what_the_round_shared(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    consumer, producer = Account.create(), Account.create()
    await ledger.register(consumer)
    claimed = RoundCommitment(consumer.address, 1, 1, [], {producer.address: {2: hashes(3)}})
    await ledger.submit(consumer, claimed.payload())
    await share(ledger, producer, 2, 2)
    with pytest.raises(CommitmentRejected) as info:
        await ledger.settle_credit(consumer, consumer.address, 1, producer.address, 2)
    assert rejection(info) == "SapoLedgerCreditExceedsShared"
    assert await ledger.credit_received(producer.address) == 0


async def test_no_round_can_lock_a_node_out(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    await ledger.register(node)
    for round_ in (2**64 - 1, MAX_ROUND_STEP + 1):
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit(node, RoundCommitment(node.address, round_, 1, hashes(1)).payload())
        assert rejection(info) == "SapoLedgerRoundTooFar"
    await ledger.submit(node, RoundCommitment(node.address, MAX_ROUND_STEP, 1, hashes(1)).payload())
    far = RoundCommitment(node.address, 2 * MAX_ROUND_STEP + 1, 1, hashes(1))
    with pytest.raises(CommitmentRejected) as info:
        await ledger.submit(node, far.payload())
    assert rejection(info) == "SapoLedgerRoundTooFar"
    step = RoundCommitment(node.address, 2 * MAX_ROUND_STEP, 1, hashes(1))
    await ledger.submit(node, step.payload())
    assert await ledger.rounds_of(node.address) == [MAX_ROUND_STEP, 2 * MAX_ROUND_STEP]


async def test_rounds_list_in_order_across_view_pages(
    ledger_backend: LedgerBackend, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(limits, "LEDGER_VIEW_PAGE", 2)
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    await ledger.register(node)
    rounds = [0, 1, 4, 9, 10]
    for r in rounds:
        await ledger.submit(node, RoundCommitment(node.address, r, r, hashes(1)).payload())
    assert await ledger.rounds_of(node.address) == rounds


async def test_relayer_spends_one_nonce_per_registration_and_commitment(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, 1, 1, hashes(1)).payload())
    await ledger.submit(node, RoundCommitment(node.address, 2, 1, hashes(1)).payload())
    assert await ledger.nonce(node.address) == 3  # one registration + two commitments


EVM_BACKENDS = ["eth_tester", pytest.param("anvil", marks=pytest.mark.anvil)]


@pytest.mark.parametrize("ledger_backend", EVM_BACKENDS, indirect=True)
async def test_relayed_node_pays_no_gas(ledger_backend: LedgerBackend):
    chain = ledger_backend.chain
    assert chain is not None
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    await ledger.register(node)
    receipt = await ledger.submit(node, RoundCommitment(node.address, 1, 1, hashes(1)).payload())
    assert receipt.gas_used > 0
    assert chain.w3.eth.get_balance(node.address) == 0


async def test_commitment_of_an_unregistered_node_is_rejected(ledger_backend: LedgerBackend):
    ledger = await relayed_ledger(ledger_backend)
    node = Account.create()
    with pytest.raises(CommitmentRejected) as info:
        await ledger.submit(node, RoundCommitment(node.address, 1, 1, hashes(1)).payload())
    assert rejection(info) == "SapoLedgerNotRegistered"


async def test_relayed_commitment_signed_by_another_key_or_replayed_is_rejected(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    node, forger = Account.create(), Account.create()
    await ledger.register(node)
    payload = RoundCommitment(node.address, 1, 1, hashes(2)).payload()
    nonce = await ledger.nonce(node.address)
    forged = sign_commitment(forger, ledger.chain_id, ledger.address, payload, nonce)
    other_ledger = sign_commitment(node, ledger.chain_id, "0x" + "11" * 20, payload, nonce)
    for signature in (forged, other_ledger):
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit_signed(node.address, payload, nonce, signature)
        assert rejection(info) == "SapoLedgerInvalidSigner"
    assert await ledger.rounds_of(node.address) == []
    assert await ledger.nonce(node.address) == nonce  # a refused relay consumes nothing
    genuine = sign_commitment(node, ledger.chain_id, ledger.address, payload, nonce)
    await ledger.submit_signed(node.address, payload, nonce, genuine)
    with pytest.raises(CommitmentRejected) as info:
        await ledger.submit_signed(node.address, payload, nonce, genuine)
    assert rejection(info) == "InvalidAccountNonce"
    assert await ledger.rounds_of(node.address) == [1]


def _malformed(valid: CommitmentPayload, node: str) -> dict[str, tuple[CommitmentPayload, str]]:
    """Payloads breaking one rule each, with the contract error that must refuse them."""
    p0, p1 = valid.producers
    r0, r1 = valid.producer_rounds
    c0, c1 = valid.counts
    many = sorted(
        (Account.create().address for _ in range(MAX_PRODUCERS + 1)), key=lambda a: int(a, 16)
    )
    big = MAX_ROLLOUTS_PER_ROUND + 1
    return {
        "round too far": (replace(valid, round=MAX_ROUND_STEP + 1), "SapoLedgerRoundTooFar"),
        "rollout count too large": (replace(valid, rollout_count=big), "SapoLedgerCountTooLarge"),
        "external count too large": (
            replace(valid, external_count=big, counts=(c0, big - c0)),
            "SapoLedgerCountTooLarge",
        ),
        "zero rollout root": (
            replace(valid, rollout_root=bytes(32)),
            "SapoLedgerRootCountMismatch",
        ),
        "zero rollout count": (replace(valid, rollout_count=0), "SapoLedgerRootCountMismatch"),
        "zero external root": (
            replace(valid, external_root=bytes(32)),
            "SapoLedgerRootCountMismatch",
        ),
        "usage lengths differ": (replace(valid, counts=(c0,)), "SapoLedgerUsageLengthMismatch"),
        "usage rounds missing": (
            replace(valid, producer_rounds=(r0,)),
            "SapoLedgerUsageLengthMismatch",
        ),
        "too many producers": (
            replace(
                valid,
                producers=tuple(many),
                producer_rounds=(1,) * len(many),
                counts=(1,) * len(many),
            ),
            "SapoLedgerTooManyProducers",
        ),
        "producers unsorted": (
            replace(valid, producers=(p1, p0), producer_rounds=(r1, r0), counts=(c1, c0)),
            "SapoLedgerProducersNotSorted",
        ),
        "producer round repeated": (
            replace(valid, producers=(p0, p0), producer_rounds=(r0, r0), counts=(c0, c1)),
            "SapoLedgerProducersNotSorted",
        ),
        "node credits itself": (
            replace(valid, producers=(node,), producer_rounds=(1,), counts=(c0 + c1,)),
            "SapoLedgerSelfUsage",
        ),
        "zero usage": (replace(valid, counts=(0, c0 + c1)), "SapoLedgerZeroUsage"),
        "usage sum differs": (replace(valid, counts=(c0, c1 + 1)), "SapoLedgerUsageSumMismatch"),
        "credit above what was shared": (
            replace(valid, counts=(c0 + 1, c1), external_count=c0 + c1 + 1),
            "SapoLedgerCreditExceedsShared",
        ),
    }


async def test_each_broken_commitment_rule_is_rejected_by_its_name(
    ledger_backend: LedgerBackend,
):
    ledger = await relayed_ledger(ledger_backend)
    node, a, b = Account.create(), Account.create(), Account.create()
    await ledger.register(node)
    a_shared, b_shared = await share(ledger, a, 1, 2), await share(ledger, b, 2, 1)
    valid = RoundCommitment(
        node.address, 1, 1, hashes(3), {a.address: {1: a_shared}, b.address: {2: b_shared}}
    ).payload()
    refused: dict[str, str | None] = {}
    expected: dict[str, str] = {}
    for case, (payload, reason) in _malformed(valid, node.address).items():
        expected[case] = reason
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit(node, payload)
        refused[case] = rejection(info)
    assert refused == expected
    assert await ledger.rounds_of(node.address) == []  # refusals leave no trace
    await ledger.submit(node, valid)
    assert await ledger.rounds_of(node.address) == [1]


async def test_unreachable_rpc_raises_ledger_unavailable():
    chain = rpc_chain(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    ledger = EvmLedger(chain, "0x" + "11" * 20)
    with pytest.raises(LedgerUnavailable):
        await ledger.node_stats("0x" + "22" * 20)
    with pytest.raises(LedgerUnavailable):
        await fund(chain, "0x" + "22" * 20)
