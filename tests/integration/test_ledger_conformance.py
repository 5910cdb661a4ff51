"""One conformance suite for the ledger port, run against eth-tester and anvil."""

from __future__ import annotations

import os

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async import limits
from sapo_async.errors import CommitmentRejected, LedgerUnavailable
from sapo_async.ledger import EvmLedger, RoundCommitment, deploy_ledger, fund, rpc_chain
from sapo_async.ledger.merkle import MerkleTree, hash_pair, leaf_hash
from sapo_async.ledger.signing import commitment_typed_data
from tests.fixtures.ledger import LedgerEnv, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.evm]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def hashes(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


async def relayed_ledger(env: LedgerEnv) -> EvmLedger:
    return await deploy_ledger(env.chain, env.deployer, "conformance", relayer=env.deployer)


async def test_register_is_idempotent_and_relayed_for_unfunded_nodes(ledger_env: LedgerEnv):
    ledger = await relayed_ledger(ledger_env)
    node: LocalAccount = Account.create()  # no funds: only a relayer can send for it
    assert await ledger.register(node, "model:tiny") is True
    assert await ledger.register(node, "model:tiny") is False
    stats = await ledger.node_stats(node.address)
    assert stats.registered
    assert stats.metadata == "model:tiny"
    assert await ledger.nodes() == [node.address]


async def test_direct_commitment_is_stored_with_totals(ledger_env: LedgerEnv):
    ledger = await deploy_ledger(ledger_env.chain, ledger_env.deployer, "direct")
    node = ledger_env.deployer  # sends its own transactions
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


async def test_repeated_or_back_filled_round_is_rejected_by_name(ledger_env: LedgerEnv):
    ledger = await relayed_ledger(ledger_env)
    node = Account.create()
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, 5, 1, hashes(2)).payload())
    for round_ in (5, 3):
        with pytest.raises(CommitmentRejected) as info:
            await ledger.submit(node, RoundCommitment(node.address, round_, 1, hashes(2)).payload())
        assert info.value.reason == "SapoLedgerRoundNotIncreasing"
    assert await ledger.rounds_of(node.address) == [5]


async def test_python_eip712_digest_matches_the_contract(ledger_env: LedgerEnv):
    ledger = await relayed_ledger(ledger_env)
    node, producer = Account.create(), Account.create()
    payload = RoundCommitment(
        node.address, 9, 3, hashes(3), {producer.address: hashes(2)}
    ).payload()
    domain, types, message = commitment_typed_data(
        ledger.chain_id, ledger.address, node.address, payload, 7
    )
    signed = Account.sign_typed_data(node.key, domain, types, message)
    contract = ledger_env.chain.w3.eth.contract(address=ledger.address, abi=ledger._contract.abi)
    on_chain = contract.functions.commitmentDigest(node.address, payload.as_abi(), 7).call()
    assert bytes(on_chain) == bytes(signed.message_hash)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 33])
async def test_python_built_proofs_verify_on_chain(ledger_env: LedgerEnv, n: int):
    ledger = await relayed_ledger(ledger_env)
    node, producer = Account.create(), Account.create()
    own, external = hashes(n), hashes(n + 1)
    commitment = RoundCommitment(node.address, 1, 1, own, {producer.address: external})
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


async def test_internal_merkle_node_is_not_accepted_as_a_rollout(ledger_env: LedgerEnv):
    ledger = await relayed_ledger(ledger_env)
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


async def test_usage_credit_reaches_producers_and_events(ledger_env: LedgerEnv):
    ledger = await relayed_ledger(ledger_env)
    a, b, c = Account.create(), Account.create(), Account.create()
    for node in (a, b, c):
        await ledger.register(node)
    await ledger.submit(
        a,
        RoundCommitment(
            a.address, 1, 1, hashes(2), {b.address: hashes(3), c.address: hashes(1)}
        ).payload(),
    )
    await ledger.submit(
        b, RoundCommitment(b.address, 1, 1, hashes(2), {c.address: hashes(4)}).payload()
    )
    assert (await ledger.node_stats(b.address)).credit_received == 3
    assert await ledger.credit_received(c.address) == 5
    assert (await ledger.node_stats(a.address)).external_used == 4
    credits = await ledger.usage_credits(producer=c.address)
    assert sorted((u.consumer, u.count) for u in credits) == sorted(
        [(a.address, 1), (b.address, 4)]
    )
    assert [u.count for u in await ledger.usage_credits(consumer=b.address)] == [4]
    events = await ledger.commitments()
    assert [(e.node, e.round) for e in events] == [(a.address, 1), (b.address, 1)]


async def test_rounds_list_in_order_across_view_pages(
    ledger_env: LedgerEnv, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(limits, "LEDGER_VIEW_PAGE", 2)
    ledger = await relayed_ledger(ledger_env)
    node = Account.create()
    await ledger.register(node)
    rounds = [0, 1, 4, 9, 10]
    for r in rounds:
        await ledger.submit(node, RoundCommitment(node.address, r, r, hashes(1)).payload())
    assert await ledger.rounds_of(node.address) == rounds


async def test_relayed_commitment_with_a_funded_relayer_only(ledger_env: LedgerEnv):
    ledger = await relayed_ledger(ledger_env)
    node = Account.create()
    await ledger.register(node)
    await ledger.submit(node, RoundCommitment(node.address, 1, 1, hashes(1)).payload())
    await ledger.submit(node, RoundCommitment(node.address, 2, 1, hashes(1)).payload())
    assert await ledger.nonce(node.address) == 3  # one registration + two commitments
    assert ledger_env.chain.w3.eth.get_balance(node.address) == 0


async def test_unreachable_rpc_raises_ledger_unavailable():
    chain = rpc_chain(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    ledger = EvmLedger(chain, "0x" + "11" * 20)
    with pytest.raises(LedgerUnavailable):
        await ledger.node_stats("0x" + "22" * 20)
    with pytest.raises(LedgerUnavailable):
        await fund(chain, "0x" + "22" * 20)
