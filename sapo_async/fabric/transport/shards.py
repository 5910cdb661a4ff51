"""Sharded rollout subjects: where a producer publishes, which shards a node reads.

Owns the pure part of sharding (no I/O): a producer's leaf, the subjects and consumer
filters built from it, the shard plan a node follows (how many shards it sees the swarm
as, how many it reads, which ones in which epoch) and the plan that keeps ingress near
``c x J`` groups per round for a swarm of N nodes.

The scheme:

* every group goes on ``sapo.<swarm>.rollouts.<family>.<d1>.<d2>.<d3>`` where ``d1 d2 d3``
  are the first three hex digits of ``keccak256("<family>:<producer>")`` (lower-case
  address): 4,096 leaves per family, fixed by the producer and the family, so a producer's
  groups of one family always share a leaf and different families spread it;
* a reader sees the swarm as S shards, S = 16^d for d in 0..3 (1, 16, 256 or 4,096): shard
  ``i`` of S is every leaf whose first d hex digits spell ``i``, one wildcard filter
  (``sapo.<swarm>.rollouts.<family>.a.>``) on the server side. Producers never need to
  know S: readers of different S coexist, and S grows with the swarm by a reader's
  setting alone;
* a node reads k of the S shards, ``k/S`` of the swarm's groups, and moves to the next k
  every ``rotate_s`` (epoch). Its shard set in epoch e is ``offset + e*k ... + k - 1``
  (mod S) with ``offset`` from its address: in ``ceil(S/k)`` epochs it has read every
  shard, so every producer stays reachable, and different nodes sit at different offsets,
  so each shard has about ``N*k/S`` readers at any time;
* ``S = 1`` reads everything, the legacy unsharded subjects ``...rollouts.<family>`` too.

Invariants: the leaf of a group is a function of what it signs (family and producer), so
a receiver checks it (a group on another leaf is rejected as ``wrong_shard``: a producer
cannot spray its groups into every shard); a reader's filters never overlap.

Deliberately does not subscribe or rotate subscriptions (see ``rotating.py``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from sapo_async.errors import ConfigError
from sapo_async.limits import SHARD_INGRESS_FACTOR, SHARD_ROTATE_S
from sapo_async.wire.rollout import keccak256

__all__ = [
    "LEAF_DIGITS",
    "SHARD_COUNTS",
    "ShardPlan",
    "ShardSet",
    "body_producer",
    "parse_rollouts_subject",
    "producer_leaf",
    "publish_subject",
    "shard_filters",
    "sharded_subject",
    "subject_matches",
]

LEAF_DIGITS = 3
"""Hex digits of a producer's leaf: 16^3 = 4,096 leaves per family, enough for a swarm of
10,000 nodes to read ~1/1000 of it (see docs/fabric.md)."""

SHARD_COUNTS = tuple(16**d for d in range(LEAF_DIGITS + 1))
"""The shard counts a reader may use: 1, 16, 256, 4,096 (a prefix of the leaf's digits)."""

_HEX = "0123456789abcdef"


@functools.lru_cache(maxsize=65536)
def producer_leaf(family: str, producer: str) -> str:
    """The producer's leaf in ``family``: ``LEAF_DIGITS`` lower-case hex digits."""
    return keccak256(f"{family}:{producer.lower()}".encode()).hex()[:LEAF_DIGITS]


def sharded_subject(swarm: str, family: str, producer: str) -> str:
    """The subject ``producer`` publishes ``family``'s groups on (tokens already valid)."""
    return f"sapo.{swarm}.rollouts.{family}." + ".".join(producer_leaf(family, producer))


def publish_subject(legacy: str, family: str, body: bytes, producer: str | None = None) -> str:
    """The subject a group body goes on: its producer's leaf below the ``legacy`` subject
    of ``family`` (the legacy subject itself for a body without a producer, which every
    receiver rejects anyway).

    Args:
        legacy: the family's unsharded subject.
        family: the task family.
        body: the encoded group.
        producer: the body's producer when the caller knows it (the publisher encoded the
            group); read back out of ``body`` only when None (raw or hostile bytes).
    """
    if producer is None:
        producer = body_producer(body)
    return legacy if producer is None else f"{legacy}." + ".".join(producer_leaf(family, producer))


class _ProducerProbe(msgspec.Struct):
    producer: str


_probe = msgspec.msgpack.Decoder(_ProducerProbe)


def body_producer(body: bytes) -> str | None:
    """The ``producer`` field of an encoded group, or ``None`` when the body has none.

    Reads only that field (the rest is skipped, not validated): the transport needs it to
    route; the collector validates the whole group on receipt.
    """
    try:
        return _probe.decode(body).producer
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def parse_rollouts_subject(swarm: str, subject: str) -> tuple[str, str | None] | None:
    """Split a rollouts subject of ``swarm`` into (family, leaf or ``None`` if legacy).

    Returns:
        ``None`` when ``subject`` is not a rollouts subject of ``swarm`` in either form.
    """
    prefix = f"sapo.{swarm}.rollouts."
    if not subject.startswith(prefix):
        return None
    tokens = subject[len(prefix) :].split(".")
    if len(tokens) == 1:
        return tokens[0], None
    if len(tokens) == 1 + LEAF_DIGITS and all(len(t) == 1 and t in _HEX for t in tokens[1:]):
        return tokens[0], "".join(tokens[1:])
    return None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, part in enumerate(want):
        if part == ">":
            return len(have) > i
        if i >= len(have) or part not in ("*", have[i]):
            return False
    return len(have) == len(want)


@dataclass(frozen=True, slots=True)
class ShardSet:
    """Which shards a consumer reads.

    Attributes:
        count: S, how many shards the reader divides the swarm into (one of
            ``SHARD_COUNTS``).
        indices: the shards read, each in ``0..S-1``, sorted, distinct.
    """

    count: int
    indices: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.count not in SHARD_COUNTS:
            raise ConfigError(
                f"shard count {self.count} must be one of {list(SHARD_COUNTS)}", field="shards"
            )
        if not self.indices or any(not 0 <= i < self.count for i in self.indices):
            raise ConfigError(
                f"shard indices {list(self.indices)} must be non-empty, "
                f"each in 0..{self.count - 1}",
                field="shards",
            )
        if tuple(sorted(set(self.indices))) != self.indices:
            raise ConfigError(f"shard indices {list(self.indices)} must be sorted and distinct")

    @classmethod
    def everything(cls) -> ShardSet:
        """All of it: one shard."""
        return cls(1, (0,))

    @property
    def digits(self) -> int:
        """Hex digits of the leaf that name a shard (0 for S = 1)."""
        return SHARD_COUNTS.index(self.count)

    def prefixes(self) -> list[str]:
        """Each shard as the hex prefix of the leaves it holds."""
        d = self.digits
        return [format(i, f"0{d}x") if d else "" for i in self.indices]

    def holds(self, leaf: str) -> bool:
        """Whether a group on ``leaf`` is in one of these shards."""
        d = self.digits
        return d == 0 or int(leaf[:d], 16) in self.indices


def shard_filters(swarm: str, families: Sequence[str] | None, shards: ShardSet) -> list[str]:
    """The consumer filter subjects for ``families`` (``None``: all) in ``shards``.

    Reading everything (S = 1) includes the legacy unsharded subjects, so groups of nodes
    that predate sharding (and what the stream held before) are still read.
    """
    fams = ["*"] if families is None else sorted(set(families))
    if shards.count == 1:
        if families is None:
            return [f"sapo.{swarm}.rollouts.>"]
        base = [f"sapo.{swarm}.rollouts.{f}" for f in fams]
        return [s for b in base for s in (b, f"{b}.>")]
    out = []
    for f in fams:
        for prefix in shards.prefixes():
            tokens = ".".join(prefix)
            tail = "" if len(prefix) == LEAF_DIGITS else ".>"
            out.append(f"sapo.{swarm}.rollouts.{f}.{tokens}{tail}")
    return out


def _key_int(key: str) -> int:
    return int.from_bytes(keccak256(key.lower().encode())[:8], "big")


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """How a node reads the swarm: S shards, k of them at a time, rotating.

    Attributes:
        count: S (one of ``SHARD_COUNTS``); 1 reads everything.
        read: k, shards read at a time, ``1..count``; ``None`` reads all S.
        rotate_s: seconds each shard set is read before moving on (an epoch).
    """

    count: int = 1
    read: int | None = None
    rotate_s: float = SHARD_ROTATE_S

    def __post_init__(self) -> None:
        if self.count not in SHARD_COUNTS:
            raise ConfigError(
                f"fabric.shards {self.count!r} must be one of {list(SHARD_COUNTS)}",
                field="fabric.shards",
            )
        if self.read is not None and not 1 <= self.read <= self.count:
            raise ConfigError(
                f"fabric.shards_read {self.read!r} must be 1..{self.count} (fabric.shards)",
                field="fabric.shards_read",
            )
        if not self.rotate_s > 0:
            raise ConfigError(
                f"fabric.shard_rotate_s {self.rotate_s!r} must be > 0",
                field="fabric.shard_rotate_s",
            )

    @property
    def k(self) -> int:
        """Shards read at a time."""
        return self.count if self.read is None else self.read

    @property
    def reads_all(self) -> bool:
        """Whether this plan reads the whole swarm (no rotation needed)."""
        return self.k == self.count

    @property
    def fraction(self) -> float:
        """The share of the swarm's groups read at a time, k/S."""
        return self.k / self.count

    @property
    def epochs_to_cover(self) -> int:
        """Epochs until every shard has been read once: ceil(S/k)."""
        return math.ceil(self.count / self.k)

    def epoch(self, key: str, now: float) -> int:
        """The epoch at unix time ``now`` for the node ``key``; each node's epochs start at
        their own phase, so the swarm's consumers are not all re-created at once."""
        phase = (_key_int(key) >> 32) % 1000 / 1000 * self.rotate_s
        return math.floor((now + phase) / self.rotate_s)

    def shards_at(self, key: str, epoch: int) -> ShardSet:
        """The shards node ``key`` reads in ``epoch``."""
        if self.reads_all:
            return ShardSet(self.count, tuple(range(self.count)))
        start = _key_int(key) % self.count + epoch * self.k
        chosen = {(start + j) % self.count for j in range(self.k)}
        return ShardSet(self.count, tuple(sorted(chosen)))

    @classmethod
    def for_swarm(
        cls,
        nodes: int,
        groups_per_node: float,
        *,
        external: int,
        factor: float = SHARD_INGRESS_FACTOR,
        rotate_s: float = SHARD_ROTATE_S,
    ) -> ShardPlan:
        """The plan that keeps a node's ingress near ``factor * external`` groups per round.

        A node would receive ``(nodes - 1) * groups_per_node`` groups per round reading
        everything; it reads ``k/S`` of them. The smallest S in ``SHARD_COUNTS`` that makes
        ``k = round(r*S) >= 4`` (r the wanted share) keeps k/S within ~12 % of r; when r is
        over a half, reading all is at most twice the target and needs no rotation.

        Raises:
            ConfigError: a count below 1.
        """
        if nodes < 1 or groups_per_node <= 0 or external < 0:
            raise ConfigError(
                f"swarm of {nodes} nodes, {groups_per_node} groups each, J={external}: "
                "need nodes >= 1, groups > 0, J >= 0",
                field="shards",
            )
        offered = max(nodes - 1, 1) * groups_per_node
        share = factor * max(external, 1) / offered
        if share >= 0.5:
            return cls(1, None, rotate_s)
        for count in SHARD_COUNTS[1:]:
            if share * count >= 4 or count == SHARD_COUNTS[-1]:
                return cls(count, max(1, min(count, round(share * count))), rotate_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def describe(self) -> str:
        """One line for doctor and logs."""
        if self.count == 1:
            return "reads every shard (S = 1: the whole swarm)"
        if self.reads_all:
            return f"reads all {self.count} shards (the whole swarm)"
        return (
            f"reads {self.k} of {self.count} shards ({self.fraction:.2%} of the swarm), "
            f"next {self.k} every {self.rotate_s:g} s, all of them every "
            f"{self.epochs_to_cover} epochs"
        )
