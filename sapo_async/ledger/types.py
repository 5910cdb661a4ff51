"""Value types of the ledger port: what a node commits per round and what the chain reports.

Owns validation of a round's commitment and its reduction to what goes on chain (roots,
counts, the address-sorted usage list). Knows nothing about web3, journals or actors.

Invariants: a :class:`RoundCommitment` is valid once constructed (32-byte unique hashes,
checksummed addresses, no self-usage, at most ``MAX_PRODUCERS`` producers, rounds and counts
within the contract's integer widths); :meth:`RoundCommitment.payload` is deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from web3 import Web3

from sapo_async.errors import RejectedInput
from sapo_async.ledger.merkle import MerkleTree

__all__ = [
    "MAX_PRODUCERS",
    "CommitmentPayload",
    "NodeStats",
    "OnChainCommitment",
    "RoundCommitment",
    "SubmitReceipt",
    "UsageCredit",
    "checksum",
]

MAX_PRODUCERS = 64
"""Mirror of ``SapoLedger.MAX_PRODUCERS``: producers one commitment may credit."""

_UINT64 = 2**64 - 1
_UINT32 = 2**32 - 1


def checksum(address: str) -> str:
    """Return ``address`` checksummed.

    Raises:
        RejectedInput: ``address`` is not a 20-byte hex address (``bad_address``).
    """
    if not isinstance(address, str) or not Web3.is_address(address):
        raise RejectedInput("bad_address", f"{address!r:.60} is not an Ethereum address")
    return str(Web3.to_checksum_address(address))


def _uint(value: int, bound: int, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= bound:
        raise RejectedInput(f"bad_{name}", f"{name}={value!r} is outside 0..{bound}")
    return value


@dataclass(frozen=True, slots=True)
class CommitmentPayload:
    """Exactly what ``SapoLedger.commit`` receives (the ``CommitmentInput`` struct)."""

    round: int
    policy_version: int
    rollout_root: bytes
    rollout_count: int
    external_root: bytes
    external_count: int
    producers: tuple[str, ...]
    counts: tuple[int, ...]

    def as_abi(self) -> tuple[Any, ...]:
        """The struct as the tuple web3 encodes."""
        return (
            self.round,
            self.policy_version,
            self.rollout_root,
            self.rollout_count,
            self.external_root,
            self.external_count,
            list(self.producers),
            list(self.counts),
        )


@dataclass(frozen=True, slots=True)
class RoundCommitment:
    """One node's commitment for one round, as the trainer hands it to the recorder.

    Attributes:
        node: the committing node's address (its identity; checksummed on construction).
        round: the node's own round counter (strictly increasing per node on chain).
        policy_version: the policy version the round's local rollouts were generated with.
        rollout_hashes: keccak-256 hashes of the groups this node shared this round.
        external_hashes: hashes of the external groups this node trained on, by producer.
    """

    node: str
    round: int
    policy_version: int
    rollout_hashes: Sequence[bytes] = ()
    external_hashes: Mapping[str, Sequence[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        node = checksum(self.node)
        object.__setattr__(self, "node", node)
        _uint(self.round, _UINT64, "round")
        _uint(self.policy_version, _UINT64, "policy_version")
        object.__setattr__(self, "rollout_hashes", tuple(bytes(h) for h in self.rollout_hashes))
        external: dict[str, tuple[bytes, ...]] = {}
        for producer, hashes in self.external_hashes.items():
            address = checksum(producer)
            if address == node:
                raise RejectedInput(
                    "self_usage", f"node {node} cannot credit itself", producer=node
                )
            if address in external:
                raise RejectedInput("duplicate_producer", address, producer=address)
            if hashes:
                external[address] = tuple(bytes(h) for h in hashes)
        if len(external) > MAX_PRODUCERS:
            raise RejectedInput(
                "too_many_producers", f"{len(external)} producers, at most {MAX_PRODUCERS}"
            )
        object.__setattr__(self, "external_hashes", external)
        # Building the trees validates every hash (32 bytes, no duplicates) up front, so a
        # bad commitment fails at the trainer, not later in the recorder.
        _uint(len(self.rollout_hashes), _UINT32, "rollout_count")
        MerkleTree.from_hashes(self.rollout_hashes)
        MerkleTree.from_hashes(h for hashes in external.values() for h in hashes)

    @property
    def external_count(self) -> int:
        """Number of external rollouts trained on."""
        return sum(len(h) for h in self.external_hashes.values())

    def rollout_tree(self) -> MerkleTree:
        """Merkle tree of this round's own rollout hashes."""
        return MerkleTree.from_hashes(self.rollout_hashes)

    def external_tree(self) -> MerkleTree:
        """Merkle tree of every external rollout hash trained on this round."""
        return MerkleTree.from_hashes(h for hs in self.external_hashes.values() for h in hs)

    def payload(self) -> CommitmentPayload:
        """Reduce to what goes on chain: roots, counts and the address-sorted usage list."""
        producers = sorted(self.external_hashes, key=lambda a: int(a, 16))
        return CommitmentPayload(
            round=self.round,
            policy_version=self.policy_version,
            rollout_root=self.rollout_tree().root,
            rollout_count=len(self.rollout_hashes),
            external_root=self.external_tree().root,
            external_count=self.external_count,
            producers=tuple(producers),
            counts=tuple(len(self.external_hashes[p]) for p in producers),
        )

    def to_json(self) -> str:
        """Serialise (hex hashes) for the journal; :meth:`from_json` inverts it."""
        return json.dumps(
            {
                "node": self.node,
                "round": self.round,
                "policy_version": self.policy_version,
                "rollout_hashes": [h.hex() for h in self.rollout_hashes],
                "external_hashes": {
                    p: [h.hex() for h in hs] for p, hs in self.external_hashes.items()
                },
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> RoundCommitment:
        """Parse what :meth:`to_json` wrote.

        Raises:
            RejectedInput: the text is not a valid serialised commitment.
        """
        try:
            data = json.loads(text)
            return cls(
                node=data["node"],
                round=data["round"],
                policy_version=data["policy_version"],
                rollout_hashes=[bytes.fromhex(h) for h in data["rollout_hashes"]],
                external_hashes={
                    p: [bytes.fromhex(h) for h in hs] for p, hs in data["external_hashes"].items()
                },
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, RejectedInput):
                raise
            raise RejectedInput("bad_commitment_json", str(exc)) from exc


@dataclass(frozen=True, slots=True)
class OnChainCommitment:
    """A commitment as stored by the contract."""

    node: str
    round: int
    policy_version: int
    rollout_root: bytes
    rollout_count: int
    external_root: bytes
    external_count: int
    block_number: int
    timestamp: int

    def matches(self, payload: CommitmentPayload) -> bool:
        """Whether this stored commitment is the one ``payload`` describes."""
        return (
            self.round == payload.round
            and self.policy_version == payload.policy_version
            and self.rollout_root == payload.rollout_root
            and self.rollout_count == payload.rollout_count
            and self.external_root == payload.external_root
            and self.external_count == payload.external_count
        )


@dataclass(frozen=True, slots=True)
class NodeStats:
    """A node's running totals on chain (all zero for an address the ledger never saw).

    Attributes:
        credit_received: rollouts of this node that *other* nodes reported training on.
    """

    node: str
    registered: bool
    metadata: str
    rounds_committed: int
    last_round: int | None
    rollouts_committed: int
    external_used: int
    credit_received: int


@dataclass(frozen=True, slots=True)
class UsageCredit:
    """One ``UsageCredited`` event: ``consumer`` trained on ``count`` rollouts of ``producer``."""

    producer: str
    consumer: str
    round: int
    count: int
    block_number: int


@dataclass(frozen=True, slots=True)
class SubmitReceipt:
    """A mined transaction."""

    tx_hash: str
    block_number: int
    gas_used: int
    contract_address: str | None = None
