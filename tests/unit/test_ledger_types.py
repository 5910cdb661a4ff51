"""RoundCommitment validation and its reduction to the on-chain payload (pure)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from web3 import Web3

from sapo_async.errors import RejectedInput
from sapo_async.ledger.merkle import EMPTY_ROOT, merkle_root
from sapo_async.ledger.types import MAX_PRODUCERS, MAX_ROLLOUTS_PER_ROUND, RoundCommitment

NODE = "0x" + "aa" * 20
P1 = "0x" + "01" * 20
P2 = "0x" + "f0" * 20


def h(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


def test_payload_carries_roots_counts_and_address_sorted_usage():
    own, e1, e2 = h(3), h(2), h(5)
    e3 = h(1)
    c = RoundCommitment(NODE.lower(), 7, 2, own, {P2: {4: e2}, P1: {9: e3, 3: e1}})
    p = c.payload()
    assert c.node == Web3.to_checksum_address(NODE)
    assert (p.round, p.policy_version, p.rollout_count, p.external_count) == (7, 2, 3, 8)
    assert p.rollout_root == merkle_root(own)
    assert p.external_root == merkle_root(e1 + e3 + e2)
    assert [x.lower() for x in p.producers] == [P1, P1, P2]
    assert p.producer_rounds == (3, 9, 4)
    assert p.counts == (2, 1, 5)


def test_empty_round_commits_zero_roots():
    p = RoundCommitment(NODE, 0, 0).payload()
    assert (p.rollout_root, p.rollout_count, p.external_root, p.external_count) == (
        EMPTY_ROOT,
        0,
        EMPTY_ROOT,
        0,
    )


def test_producers_with_no_hashes_are_dropped():
    assert RoundCommitment(NODE, 1, 1, h(1), {P1: {}}).payload().producers == ()
    assert RoundCommitment(NODE, 1, 1, h(1), {P1: {2: []}}).payload().producers == ()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"node": "not-an-address"}, "bad_address"),
        ({"round": -1}, "bad_round"),
        ({"round": 2**64}, "bad_round"),
        ({"policy_version": True}, "bad_policy_version"),
        ({"external_hashes": {NODE: {1: h(1)}}}, "self_usage"),
        ({"external_hashes": {"0x12": {1: h(1)}}}, "bad_address"),
        ({"external_hashes": {P1: h(1)}}, "bad_external_hashes"),
        ({"external_hashes": {P1: {-1: h(1)}}}, "bad_producer_round"),
        ({"rollout_hashes": h(MAX_ROLLOUTS_PER_ROUND + 1)}, "bad_rollout_count"),
        ({"external_hashes": {P1: {1: h(MAX_ROLLOUTS_PER_ROUND + 1)}}}, "bad_external_count"),
        ({"rollout_hashes": [b"short"]}, "bad_rollout_hash"),
    ],
)
def test_invalid_commitments_are_rejected_with_a_reason(kwargs, reason):
    args = {"node": NODE, "round": 1, "policy_version": 1, "rollout_hashes": h(1)} | kwargs
    with pytest.raises(RejectedInput) as info:
        RoundCommitment(**args)
    assert info.value.reason == reason


def test_duplicate_rollouts_are_rejected():
    x = os.urandom(32)
    with pytest.raises(RejectedInput) as info:
        RoundCommitment(NODE, 1, 1, [x, x])
    assert info.value.reason == "duplicate_rollout_hash"


def test_too_many_producers_are_rejected():
    usage = {f"0x{i + 1:040x}": {1: h(1)} for i in range(MAX_PRODUCERS + 1)}
    with pytest.raises(RejectedInput) as info:
        RoundCommitment(NODE, 1, 1, h(1), usage)
    assert info.value.reason == "too_many_producers"
    # The bound is on usage entries (producer rounds), not on distinct producers.
    rounds = {P1: {r: h(1) for r in range(MAX_PRODUCERS + 1)}}
    with pytest.raises(RejectedInput) as info:
        RoundCommitment(NODE, 1, 1, h(1), rounds)
    assert info.value.reason == "too_many_producers"


@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.lists(st.binary(min_size=32, max_size=32), unique=True, max_size=10),
)
def test_json_round_trip_keeps_the_commitment_and_its_payload(round_, version, own):
    c = RoundCommitment(NODE, round_, version, own, {P1: {round_: [os.urandom(32)]}})
    back = RoundCommitment.from_json(c.to_json())
    assert back == c
    assert back.payload() == c.payload()


def test_bad_json_is_rejected():
    with pytest.raises(RejectedInput) as info:
        RoundCommitment.from_json('{"node": 1}')
    assert info.value.reason == "bad_commitment_json"
