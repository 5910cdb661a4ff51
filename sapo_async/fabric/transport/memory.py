"""In-process transport: a JetStream look-alike for tests and single-process swarms.

Owns a :class:`MemoryBroker` (one stream per swarm, held in memory) and the
:class:`MemoryTransport` connections to it. Semantics follow the JetStream backend closely
enough that one conformance suite runs against both: subjects per family and producer leaf,
consumer filters with NATS wildcards (shards), de-duplication by
message id within a window, limits retention by age and bytes, a per-message size cap,
pull consumers with a start point, explicit acks, and durable consumers that resume at
their first unacknowledged message.

Deliberately does not implement ack-wait redelivery inside one live subscription (a
JetStream consumer redelivers after ``ack_wait``); unacked messages come again only when a
durable consumer is resumed. Nothing here does I/O, so nothing can be "unavailable" except
a closed connection.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio

from sapo_async.errors import PublishRefused, TransportError, TransportUnavailable
from sapo_async.fabric.transport.base import (
    PublishAck,
    StartAt,
    message_id,
    rollouts_subject,
    validate_token,
)
from sapo_async.fabric.transport.shards import (
    ShardSet,
    publish_subject,
    shard_filters,
    subject_matches,
)
from sapo_async.limits import DUPLICATE_WINDOW_S, MAX_GROUP_BYTES, STREAM_MAX_AGE_S
from sapo_async.pulse import Pulse
from sapo_async.wire.rollout import SignedGroup
from sapo_async.wire.signing import encode_signed

__all__ = ["MemoryBroker", "MemoryDelivery", "MemorySubscription", "MemoryTransport"]


@dataclass(frozen=True, slots=True)
class _Stored:
    seq: int
    subject: str
    data: bytes
    msg_id: str | None
    published_at: float


@dataclass(slots=True)
class _ConsumerState:
    filters: tuple[str, ...]
    next_seq: int
    unacked: set[int] = field(default_factory=set)


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: deque[_Stored] = deque()
        self.bytes = 0
        self.last_seq = 0
        self.dedup: dict[str, tuple[int, float]] = {}
        self.durables: dict[str, _ConsumerState] = {}
        self.arrived = Pulse()

    def get(self, seq: int) -> _Stored | None:
        if not self.messages:
            return None
        index = seq - self.messages[0].seq
        return self.messages[index] if 0 <= index < len(self.messages) else None

    def first_seq_since(self, since: float) -> int:
        for stored in self.messages:
            if stored.published_at >= since:
                return stored.seq
        return self.last_seq + 1


class MemoryBroker:
    """Holds the streams of an in-process swarm; hand out connections with :meth:`connect`.

    Args:
        duplicate_window: seconds a message id is remembered for de-duplication.
        max_age: seconds a message is kept.
        max_bytes: total payload bytes kept per stream (oldest dropped first).
        max_msg_size: largest accepted payload.
        clock: unix-seconds clock (injectable for tests of age limits).
    """

    def __init__(
        self,
        *,
        duplicate_window: float = DUPLICATE_WINDOW_S,
        max_age: float = STREAM_MAX_AGE_S,
        max_bytes: int | None = None,
        max_msg_size: int = MAX_GROUP_BYTES + 1024,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.duplicate_window = duplicate_window
        self.max_age = max_age
        self.max_bytes = max_bytes
        self.max_msg_size = max_msg_size
        self._clock = clock or time.time  # looked up now, not at import
        self._streams: dict[str, _Stream] = {}

    def connect(self, swarm: str) -> MemoryTransport:
        """Open a connection to ``swarm``'s stream (created on first use)."""
        validate_token(swarm, field="swarm")
        return MemoryTransport(self, swarm)

    def stream(self, swarm: str) -> _Stream:
        stream = self._streams.get(swarm)
        if stream is None:
            stream = self._streams[swarm] = _Stream(f"SAPO_{swarm}")
        return stream

    def now(self) -> float:
        return self._clock()

    def store(self, swarm: str, subject: str, data: bytes, msg_id: str | None) -> PublishAck:
        stream = self.stream(swarm)
        now = self._clock()
        if len(data) > self.max_msg_size:
            raise PublishRefused(
                f"message of {len(data)} bytes exceeds max_msg_size {self.max_msg_size}",
                rollout_hash=msg_id,
            )
        self._expire(stream, now)
        if msg_id is not None:
            seen = stream.dedup.get(msg_id)
            if seen is not None and now - seen[1] <= self.duplicate_window:
                return PublishAck(stream=stream.name, seq=seen[0], duplicate=True)
        stream.last_seq += 1
        stored = _Stored(stream.last_seq, subject, data, msg_id, now)
        stream.messages.append(stored)
        stream.bytes += len(data)
        if msg_id is not None:
            stream.dedup[msg_id] = (stored.seq, now)
        while self.max_bytes is not None and stream.bytes > self.max_bytes and stream.messages:
            stream.bytes -= len(stream.messages.popleft().data)
        stream.arrived.fire()
        return PublishAck(stream=stream.name, seq=stored.seq, duplicate=False)

    def _expire(self, stream: _Stream, now: float) -> None:
        while stream.messages and now - stream.messages[0].published_at > self.max_age:
            stream.bytes -= len(stream.messages.popleft().data)
        # Ids are remembered in the order they were stored (their times ascend), so the
        # expired ones are at the front: a scan of every id on every store and fetch made
        # a flood of thousands of ids quadratic (the tiny attack matrix's flood).
        dedup = stream.dedup
        while dedup:
            msg_id, (_, t) = next(iter(dedup.items()))
            if now - t <= self.duplicate_window:
                break
            del dedup[msg_id]


@dataclass(frozen=True, slots=True)
class MemoryDelivery:
    """A message handed out by a :class:`MemorySubscription` (see ``base.Delivery``)."""

    data: bytes
    msg_id: str | None
    subject: str
    seq: int
    published_at: float
    _state: _ConsumerState

    async def ack(self) -> None:
        """Acknowledge; idempotent."""
        self._state.unacked.discard(self.seq)


class MemorySubscription:
    """A pull consumer on a :class:`MemoryBroker` stream."""

    def __init__(self, stream: _Stream, state: _ConsumerState, broker: MemoryBroker) -> None:
        self._stream = stream
        self._state = state
        self._broker = broker
        self._closed = False
        # A resumed consumer hands out what it delivered but never saw acked first.
        self._redeliver = sorted(state.unacked)

    async def fetch(self, max_messages: int, max_wait: float) -> list[MemoryDelivery]:
        """See ``base.Subscription.fetch``."""
        if max_messages < 1 or max_wait <= 0:
            raise ValueError("max_messages must be >= 1 and max_wait > 0")
        with anyio.move_on_after(max_wait):
            while True:
                if self._closed:
                    raise TransportUnavailable("subscription is closed")
                batch = self._take(max_messages)
                if batch:
                    return batch
                await self._stream.arrived.wait()
        return []

    def _take(self, max_messages: int) -> list[MemoryDelivery]:
        self._broker._expire(self._stream, self._broker.now())
        out: list[MemoryDelivery] = []
        while self._redeliver and len(out) < max_messages:
            stored = self._stream.get(self._redeliver.pop(0))
            if stored is not None:
                out.append(self._deliver(stored))
        first = self._stream.messages[0].seq if self._stream.messages else self._state.next_seq
        self._state.next_seq = max(self._state.next_seq, first)
        while len(out) < max_messages and self._state.next_seq <= self._stream.last_seq:
            stored = self._stream.get(self._state.next_seq)
            self._state.next_seq += 1
            if stored is not None and any(
                subject_matches(f, stored.subject) for f in self._state.filters
            ):
                out.append(self._deliver(stored))
        return out

    def _deliver(self, stored: _Stored) -> MemoryDelivery:
        self._state.unacked.add(stored.seq)
        return MemoryDelivery(
            stored.data, stored.msg_id, stored.subject, stored.seq, stored.published_at, self._state
        )

    async def aclose(self) -> None:
        """Stop consuming (idempotent); a durable consumer keeps its position."""
        self._closed = True
        self._stream.arrived.fire()


class MemoryTransport:
    """A connection to one swarm's in-memory stream (see ``base.Transport``)."""

    def __init__(self, broker: MemoryBroker, swarm: str) -> None:
        self._broker = broker
        self._swarm = swarm
        self._closed = False

    @property
    def swarm(self) -> str:
        """The swarm this connection publishes to and reads from."""
        return self._swarm

    @property
    def leaves(self) -> bool:
        """See ``base.Transport.leaves``: the in-memory stream takes every subject."""
        return True

    async def publish(
        self,
        signed: SignedGroup,
        *,
        family: str,
        producer: str | None = None,
        rollout_hash: bytes | None = None,
    ) -> PublishAck:
        """See ``base.Transport.publish``."""
        legacy = rollouts_subject(self._swarm, family)
        subject = publish_subject(legacy, family, signed.body, producer)
        if self._closed:
            raise TransportUnavailable("transport is closed")
        await anyio.lowlevel.checkpoint()
        return self._broker.store(
            self._swarm, subject, encode_signed(signed), message_id(signed, rollout_hash)
        )

    async def subscribe(
        self,
        *,
        families: Sequence[str] | None = None,
        start: StartAt | None = None,
        durable: str | None = None,
        shards: ShardSet | None = None,
    ) -> MemorySubscription:
        """See ``base.Transport.subscribe``."""
        if self._closed:
            raise TransportUnavailable("transport is closed")
        for family in families or ():
            rollouts_subject(self._swarm, family)  # validates the token
        subjects = tuple(shard_filters(self._swarm, families, shards or ShardSet.everything()))
        stream = self._broker.stream(self._swarm)
        if durable is not None:
            validate_token(durable, field="durable")
            state = stream.durables.get(durable)
            if state is not None:
                if state.filters != subjects:
                    raise TransportError(f"durable consumer {durable!r} exists with other families")
                return MemorySubscription(stream, state, self._broker)
        start = start or StartAt.new()
        if start.lookback_s is None:
            next_seq = stream.last_seq + 1
        elif math.isinf(start.lookback_s):
            next_seq = stream.messages[0].seq if stream.messages else stream.last_seq + 1
        else:
            next_seq = stream.first_seq_since(self._broker.now() - start.lookback_s)
        state = _ConsumerState(subjects, next_seq)
        if durable is not None:
            stream.durables[durable] = state
        return MemorySubscription(stream, state, self._broker)

    async def aclose(self) -> None:
        """Close this connection (idempotent)."""
        self._closed = True
