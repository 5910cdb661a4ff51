"""The transport port: how signed rollout groups travel between nodes.

Owns the protocol every backend implements (in-memory, JetStream) and the small value
types they share: subject naming, where a consumer starts, publish acks and deliveries.

Deliberately does not know what a group means: a transport moves opaque envelope bytes,
de-duplicates them by message id (the rollout hash) and hands them to a consumer, which
acknowledges each after handling it. Verification is the collector's job.

Invariants:
    * the subject of a group is ``sapo.<swarm>.rollouts.<family>.<d1>.<d2>.<d3>``, the
      producer's leaf in that family (see ``shards``); nodes that predate sharding
      published on ``sapo.<swarm>.rollouts.<family>``, which whole-swarm readers still read;
    * the message id is the lower-case hex rollout hash, so a re-publish (a retry after a
      lost ack) within the duplicate window is stored once;
    * ``publish`` returns only once the server acknowledged the message as stored;
    * a subscription yields every stored message on its subjects from its start point at
      least once; unacknowledged ones may come again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sapo_async.errors import ConfigError
from sapo_async.fabric.transport.shards import ShardSet
from sapo_async.wire.rollout import SignedGroup
from sapo_async.wire.signing import rollout_hash as hash_body

__all__ = [
    "Delivery",
    "PublishAck",
    "StartAt",
    "Subscription",
    "Transport",
    "message_id",
    "rollouts_subject",
    "validate_token",
]

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def validate_token(value: str, *, field: str) -> str:
    """Check that ``value`` can be one NATS subject token (and a stream-name part).

    Raises:
        ConfigError: it has characters outside ``[A-Za-z0-9_-]`` or is not 1..64 long.
    """
    if not _TOKEN.match(value):
        raise ConfigError(
            f"{field} {value!r} must be 1-64 characters of [A-Za-z0-9_-]", field=field
        )
    return value


def message_id(signed: SignedGroup, rollout_hash: bytes | None = None) -> str:
    """The message id of ``signed`` (its rollout hash, hex): the caller's hash when it
    passes one (the publisher hashed the body to sign it), else the body hashed here."""
    return (hash_body(signed.body) if rollout_hash is None else rollout_hash).hex()


def rollouts_subject(swarm: str, family: str) -> str:
    """The unsharded (legacy) subject of ``family`` in ``swarm``; a transport publishes on
    the producer's leaf below it (``shards.sharded_subject``).

    Raises:
        ConfigError: swarm or family is not a valid subject token.
    """
    swarm = validate_token(swarm, field="swarm")
    family = validate_token(family, field="family")
    return f"sapo.{swarm}.rollouts.{family}"


@dataclass(frozen=True, slots=True)
class StartAt:
    """Where a new consumer starts reading.

    Attributes:
        lookback_s: ``None`` for new messages only; otherwise messages stored in the last
            ``lookback_s`` seconds (``float('inf')`` for everything still in the stream).
    """

    lookback_s: float | None = None

    @classmethod
    def new(cls) -> StartAt:
        """Only messages published after the consumer was created."""
        return cls(None)

    @classmethod
    def last(cls, seconds: float) -> StartAt:
        """Messages stored in the last ``seconds`` seconds, then everything new."""
        if seconds < 0:
            raise ConfigError(f"lookback must be >= 0 seconds, got {seconds}", field="start")
        return cls(seconds)

    @classmethod
    def everything(cls) -> StartAt:
        """Everything the stream still holds."""
        return cls(float("inf"))


@dataclass(frozen=True, slots=True)
class PublishAck:
    """The server's acknowledgement of a publish.

    Attributes:
        stream: the stream that stored it.
        seq: its sequence number in the stream.
        duplicate: the server already had this message id (nothing new was stored).
    """

    stream: str
    seq: int
    duplicate: bool


class Delivery(Protocol):
    """One message handed to a consumer.

    Attributes:
        data: the envelope bytes.
        msg_id: the publisher's message id (claimed rollout hash, hex), if any.
        subject: the subject it was published on.
        seq: its stream sequence number.
        published_at: unix seconds when the server stored it.
    """

    @property
    def data(self) -> bytes: ...
    @property
    def msg_id(self) -> str | None: ...
    @property
    def subject(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def published_at(self) -> float: ...

    async def ack(self) -> None:
        """Acknowledge: the consumer is done with it and it must not come again."""
        ...


@runtime_checkable
class Subscription(Protocol):
    """A pull consumer. Fetch, handle, ack."""

    async def fetch(self, max_messages: int, max_wait: float) -> Sequence[Delivery]:
        """Wait up to ``max_wait`` seconds for up to ``max_messages`` messages.

        Returns:
            Possibly empty, once at least one message arrived or ``max_wait`` passed.

        Raises:
            TransportError: the consumer is broken beyond this subscription's own repair.
        """
        ...

    async def aclose(self) -> None:
        """Stop consuming (idempotent). Fetched, unacked messages are handed back; a
        durable consumer stays on the server."""
        ...


@runtime_checkable
class Transport(Protocol):
    """A connection to one swarm's rollout stream."""

    @property
    def swarm(self) -> str: ...

    @property
    def leaves(self) -> bool:
        """Whether this swarm's groups go on their producers' leaves (the stream takes
        leaf subjects). Then a group on a legacy family subject is on nobody's leaf and
        receivers reject it as ``wrong_shard``; when False (a stream from before sharding
        that nobody widened) every group is on its family's legacy subject."""
        ...

    async def publish(
        self,
        signed: SignedGroup,
        *,
        family: str,
        producer: str | None = None,
        rollout_hash: bytes | None = None,
    ) -> PublishAck:
        """Publish ``signed`` on its producer's leaf of ``family`` and wait for the ack.

        Args:
            signed: the envelope.
            family: the group's task family.
            producer: the group's producer, when the caller encoded the group (the
                publisher): the subject is routed on it without decoding the body again.
            rollout_hash: ``rollout_hash(signed.body)`` when the caller has it: the
                message id, without hashing the body again. Both are derived from the
                body when None (a test or a hostile peer publishing raw bytes).

        Raises:
            PublishError: the server did not acknowledge in time (safe to retry: the
                message id de-duplicates).
            PublishRefused: the server refused the message for good, e.g. too large (do not
                retry).
            TransportUnavailable: not connected.
            ConfigError: ``family`` is not a valid subject token.
        """
        ...

    async def subscribe(
        self,
        *,
        families: Sequence[str] | None = None,
        start: StartAt | None = None,
        durable: str | None = None,
        shards: ShardSet | None = None,
    ) -> Subscription:
        """Create (or resume) a pull consumer.

        Args:
            families: families to read; ``None`` for all of them.
            start: where a *new* consumer starts (default: new messages only); a resumed
                durable one continues where it left off.
            durable: a name to keep the consumer's position across restarts of this node;
                ``None`` for a consumer that disappears once unused.
            shards: the shards to read (``None``: all; see ``shards.shard_filters``).

        Raises:
            TransportError: the consumer could not be created.
        """
        ...

    async def aclose(self) -> None:
        """Close the connection (idempotent); open subscriptions stop working."""
        ...
