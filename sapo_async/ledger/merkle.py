"""Merkle trees over rollout hashes that OpenZeppelin's ``MerkleProof`` verifies on chain.

Owns the tree shape, roots and inclusion proofs; knows nothing about the chain, rollouts or
nodes (pure core). Scheme, mirrored by ``SapoLedger.leafOf`` and OZ ``MerkleProof``:

- a leaf is ``keccak256(rollout_hash)``: the 32-byte rollout hash is hashed once more, so a
  leaf is the hash of 32 bytes while an internal node is the hash of 64 bytes; an internal
  node can therefore never be presented as a committed rollout (second-preimage defence, the
  reason OZ's StandardMerkleTree double-hashes too);
- internal nodes hash the *sorted* pair, ``keccak256(min(a, b) || max(a, b))``, which is what
  ``MerkleProof.verify`` computes, so proofs carry no left/right flags;
- leaves are sorted before building, so the root depends on the set of hashes, not on their
  order; duplicates are rejected (a set of rollouts has no duplicates);
- a level with an odd count promotes its last node unchanged to the next level;
- the root of no hashes is 32 zero bytes (the contract pairs a zero root with a zero count);
  a single hash's root is its leaf and its proof is empty.

Invariants: ``verify(tree.root, h, tree.proof(h))`` holds for every ``h`` in the tree, and
proofs have at most ``ceil(log2(n))`` elements.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sapo_async.errors import RejectedInput
from sapo_async.wire.rollout import keccak256

__all__ = ["EMPTY_ROOT", "MerkleTree", "hash_pair", "leaf_hash", "merkle_root", "verify_proof"]

EMPTY_ROOT = bytes(32)
"""Root committed for a round without rollouts."""


def _check_hash(value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != 32:
        raise RejectedInput("bad_rollout_hash", f"expected 32 bytes, got {value!r:.80}")
    return bytes(value)


def leaf_hash(rollout_hash: bytes) -> bytes:
    """Return the Merkle leaf of a 32-byte rollout hash: ``keccak256(rollout_hash)``.

    Raises:
        RejectedInput: ``rollout_hash`` is not 32 bytes.
    """
    return keccak256(_check_hash(rollout_hash))


def hash_pair(a: bytes, b: bytes) -> bytes:
    """Hash two nodes as OpenZeppelin's ``Hashes.commutativeKeccak256`` does."""
    return keccak256(a + b) if a < b else keccak256(b + a)


class MerkleTree:
    """An immutable tree over a set of rollout hashes.

    Build with :meth:`from_hashes`; read :attr:`root`, :attr:`count` and :meth:`proof`.
    """

    __slots__ = ("_index", "_levels")

    def __init__(self, levels: list[list[bytes]], index: dict[bytes, int]) -> None:
        self._levels = levels
        self._index = index

    @classmethod
    def from_hashes(cls, rollout_hashes: Iterable[bytes]) -> MerkleTree:
        """Build the tree of ``rollout_hashes`` (any order).

        Raises:
            RejectedInput: a hash is not 32 bytes (``bad_rollout_hash``) or appears twice
                (``duplicate_rollout_hash``).
        """
        by_leaf: dict[bytes, bytes] = {}
        for rollout_hash in map(_check_hash, rollout_hashes):
            leaf = keccak256(rollout_hash)
            if leaf in by_leaf:
                raise RejectedInput("duplicate_rollout_hash", rollout_hash.hex())
            by_leaf[leaf] = rollout_hash
        leaves = sorted(by_leaf)
        index = {by_leaf[leaf]: position for position, leaf in enumerate(leaves)}
        levels = [leaves]
        while len(levels[-1]) > 1:
            below = levels[-1]
            above = [hash_pair(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
            if len(below) % 2:
                above.append(below[-1])
            levels.append(above)
        return cls(levels, index)

    @property
    def root(self) -> bytes:
        """The 32-byte root (``EMPTY_ROOT`` for no hashes)."""
        return self._levels[-1][0] if self._levels[0] else EMPTY_ROOT

    @property
    def count(self) -> int:
        """Number of rollout hashes in the tree."""
        return len(self._levels[0])

    def __contains__(self, rollout_hash: object) -> bool:
        return rollout_hash in self._index

    def proof(self, rollout_hash: bytes) -> list[bytes]:
        """Return the sibling path proving ``rollout_hash`` is in the tree.

        Raises:
            RejectedInput: ``rollout_hash`` is not in the tree (``rollout_not_in_tree``).
        """
        position = self._index.get(rollout_hash)
        if position is None:
            raise RejectedInput("rollout_not_in_tree", bytes(rollout_hash).hex())
        path: list[bytes] = []
        for level in self._levels[:-1]:
            sibling = position ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            position //= 2
        return path


def merkle_root(rollout_hashes: Iterable[bytes]) -> bytes:
    """Return the root of the tree of ``rollout_hashes`` (see :class:`MerkleTree`)."""
    return MerkleTree.from_hashes(rollout_hashes).root


def verify_proof(root: bytes, rollout_hash: bytes, proof: Sequence[bytes]) -> bool:
    """Check an inclusion proof off chain, exactly as ``MerkleProof.verify`` does on chain."""
    node = leaf_hash(rollout_hash)
    for sibling in proof:
        node = hash_pair(node, sibling)
    return node == root
