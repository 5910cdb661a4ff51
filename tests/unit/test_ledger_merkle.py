"""The Merkle core: roots, proofs and the scheme OZ MerkleProof verifies (pure, no chain)."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapo_async.errors import RejectedInput
from sapo_async.ledger.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    hash_pair,
    leaf_hash,
    merkle_root,
    verify_proof,
)
from sapo_async.wire.rollout import keccak256

hash_sets = st.sets(st.binary(min_size=32, max_size=32), min_size=1, max_size=80)


@given(hash_sets)
def test_every_member_has_a_proof_that_verifies(hashes: set[bytes]):
    tree = MerkleTree.from_hashes(hashes)
    for h in hashes:
        proof = tree.proof(h)
        assert verify_proof(tree.root, h, proof)
        assert len(proof) <= math.ceil(math.log2(len(hashes))) if len(hashes) > 1 else not proof


@given(hash_sets, st.randoms())
def test_root_does_not_depend_on_order(hashes: set[bytes], rnd):
    ordered = sorted(hashes)
    shuffled = list(hashes)
    rnd.shuffle(shuffled)
    assert merkle_root(ordered) == merkle_root(shuffled)


@given(hash_sets, st.binary(min_size=32, max_size=32))
def test_non_member_does_not_verify_with_a_member_proof(hashes: set[bytes], stranger: bytes):
    tree = MerkleTree.from_hashes(hashes)
    member = next(iter(hashes))
    if stranger not in hashes:
        assert not verify_proof(tree.root, stranger, tree.proof(member))


def test_small_trees_match_the_documented_scheme():
    a, b, c = (keccak256(bytes([i])) for i in range(3))
    assert merkle_root([]) == EMPTY_ROOT
    assert merkle_root([a]) == keccak256(a)  # leaf = keccak(rollout hash)
    assert merkle_root([b, a]) == hash_pair(leaf_hash(a), leaf_hash(b))
    s0, s1, s2 = sorted([leaf_hash(a), leaf_hash(b), leaf_hash(c)])
    assert merkle_root([c, a, b]) == hash_pair(hash_pair(s0, s1), s2)  # odd node promoted


def test_hash_pair_is_commutative():
    x, y = os.urandom(32), os.urandom(32)
    assert hash_pair(x, y) == hash_pair(y, x) == keccak256(min(x, y) + max(x, y))


def test_single_hash_has_an_empty_proof():
    h = os.urandom(32)
    assert MerkleTree.from_hashes([h]).proof(h) == []


def test_duplicate_hashes_are_rejected():
    h = os.urandom(32)
    with pytest.raises(RejectedInput) as info:
        MerkleTree.from_hashes([h, os.urandom(32), h])
    assert info.value.reason == "duplicate_rollout_hash"


@pytest.mark.parametrize("bad", [b"", b"x" * 31, b"x" * 33, "ab" * 16])
def test_hashes_that_are_not_32_bytes_are_rejected(bad):
    with pytest.raises(RejectedInput) as info:
        MerkleTree.from_hashes([bad])
    assert info.value.reason == "bad_rollout_hash"


def test_proof_of_a_non_member_is_refused():
    tree = MerkleTree.from_hashes([os.urandom(32)])
    with pytest.raises(RejectedInput) as info:
        tree.proof(os.urandom(32))
    assert info.value.reason == "rollout_not_in_tree"
