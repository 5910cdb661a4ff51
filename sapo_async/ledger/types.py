"""Value types of the ledger port: what a node commits per round and what the chain reports.

Owns validation of a round's commitment and its reduction to what goes on chain (roots,
counts, the address-sorted usage list). Knows nothing about web3, journals or actors.

Invariants: a :class:`RoundCommitment` is valid once constructed (32-byte unique hashes,
checksummed addresses, no self-usage, at most ``MAX_PRODUCERS`` usage entries (one per
producer round), counts within ``MAX_ROLLOUTS_PER_ROUND``, rounds within the contract's
integer widths); :meth:`RoundCommitment.payload` is deterministic. Whether each credited
producer round exists on chain (the contract's credit rules) is the ledger's to check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from web3 import Web3

from sapo_async.errors import RejectedInput
from sapo_async.ledger.merkle import MerkleTree
from sapo_async.limits import MAX_ROLLOUTS_PER_ROUND  # the contract's mirror, re-exported

__all__ = [
    "MAX_BATCH",
    "MAX_PRODUCERS",
    "MAX_ROLLOUTS_PER_ROUND",
    "MAX_ROUND_STEP",
    "CommitmentPayload",
    "OnChainCommitment",
    "OnChainTotals",
    "RoundCommitment",
    "SubmitReceipt",
    "UsageCredit",
    "checksum",
]

MAX_PRODUCERS = 64
"""Mirror of ``SapoLedger.MAX_PRODUCERS``: usage entries (producer, producer round) one
commitment may carry."""


MAX_BATCH = 64
"""Mirror of ``SapoLedger.MAX_BATCH``: commitments one ``commitMany`` transaction may carry."""


MAX_ROUND_STEP = 2**32
"""Mirror of ``SapoLedger.MAX_ROUND_STEP``: most a node's round may jump above its last (and
the highest first round), so no node can lock itself out by committing round 2**64-1."""

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
    producer_rounds: tuple[int, ...]
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
            list(self.producer_rounds),
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
        external_hashes: hashes of the external groups this node trained on, by producer and
            by the producer's round that shared them (``{producer: {producer_round: hashes}}``):
            the contract credits a producer only for a round it committed.
    """

    node: str
    round: int
    policy_version: int
    rollout_hashes: Sequence[bytes] = ()
    external_hashes: Mapping[str, Mapping[int, Sequence[bytes]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        node = checksum(self.node)
        object.__setattr__(self, "node", node)
        _uint(self.round, _UINT64, "round")
        _uint(self.policy_version, _UINT64, "policy_version")
        object.__setattr__(self, "rollout_hashes", tuple(bytes(h) for h in self.rollout_hashes))
        external: dict[str, dict[int, tuple[bytes, ...]]] = {}
        for producer, by_round in self.external_hashes.items():
            address = checksum(producer)
            if address == node:
                raise RejectedInput(
                    "self_usage", f"node {node} cannot credit itself", producer=node
                )
            if address in external:
                raise RejectedInput("duplicate_producer", address, producer=address)
            if not isinstance(by_round, Mapping):
                raise RejectedInput(
                    "bad_external_hashes",
                    f"external_hashes[{address}] must map producer rounds to hashes",
                    producer=address,
                )
            rounds = {
                _uint(r, _UINT64, "producer_round"): tuple(bytes(h) for h in hashes)
                for r, hashes in by_round.items()
                if hashes
            }
            if rounds:
                external[address] = dict(sorted(rounds.items()))
        entries = sum(len(rounds) for rounds in external.values())
        if entries > MAX_PRODUCERS:
            raise RejectedInput(
                "too_many_producers",
                f"{entries} usage entries (producer rounds), at most {MAX_PRODUCERS}",
            )
        object.__setattr__(self, "external_hashes", external)
        # Building the trees validates every hash (32 bytes, no duplicates) up front, so a
        # bad commitment fails at the trainer, not later in the recorder.
        _uint(len(self.rollout_hashes), MAX_ROLLOUTS_PER_ROUND, "rollout_count")
        _uint(self.external_count, MAX_ROLLOUTS_PER_ROUND, "external_count")
        MerkleTree.from_hashes(self.rollout_hashes)
        self.external_tree()

    @property
    def external_count(self) -> int:
        """Number of external rollouts trained on."""
        return sum(len(h) for _, _, h in self.usage())

    def usage(self) -> list[tuple[str, int, tuple[bytes, ...]]]:
        """``(producer, producer_round, hashes)`` entries in the contract's order: ascending by
        producer address, then by round."""
        return [
            (producer, r, tuple(self.external_hashes[producer][r]))
            for producer in sorted(self.external_hashes, key=lambda a: int(a, 16))
            for r in sorted(self.external_hashes[producer])
        ]

    def rollout_tree(self) -> MerkleTree:
        """Merkle tree of this round's own rollout hashes."""
        return MerkleTree.from_hashes(self.rollout_hashes)

    def external_tree(self) -> MerkleTree:
        """Merkle tree of every external rollout hash trained on this round."""
        return MerkleTree.from_hashes(h for _, _, hs in self.usage() for h in hs)

    def payload(self) -> CommitmentPayload:
        """Reduce to what goes on chain: roots, counts and the sorted usage list."""
        usage = self.usage()
        return CommitmentPayload(
            round=self.round,
            policy_version=self.policy_version,
            rollout_root=self.rollout_tree().root,
            rollout_count=len(self.rollout_hashes),
            external_root=self.external_tree().root,
            external_count=self.external_count,
            producers=tuple(p for p, _, _ in usage),
            producer_rounds=tuple(r for _, r, _ in usage),
            counts=tuple(len(hs) for _, _, hs in usage),
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
                    p: {str(r): [h.hex() for h in hs] for r, hs in rounds.items()}
                    for p, rounds in self.external_hashes.items()
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
                    p: {int(r): [bytes.fromhex(h) for h in hs] for r, hs in rounds.items()}
                    for p, rounds in data["external_hashes"].items()
                },
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
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
class OnChainTotals:
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
    """One ``UsageCredited`` event: ``consumer``, in its round ``round``, trained on ``count``
    rollouts ``producer`` committed in its round ``producer_round``."""

    producer: str
    consumer: str
    round: int
    count: int
    block_number: int
    producer_round: int


@dataclass(frozen=True, slots=True)
class SubmitReceipt:
    """A mined transaction, or one commitment's part of a ``commitMany`` one (its hash and
    block, its own claims, and ``gas_used`` the transaction's shared evenly over its rounds)."""

    tx_hash: str
    block_number: int
    gas_used: int
    contract_address: str | None = None
    claimed: tuple[tuple[str, int], ...] = ()
    """The (producer, producer round) usage entries this transaction kept as claims
    (``UsageClaimed``: that round was not on chain yet), in log order."""
    claim_rounds: tuple[int, ...] = ()
    """The consumer round of each entry of ``claimed`` (a ``commitMany`` transaction holds
    several rounds' claims); empty where the receipt is one round's own."""
