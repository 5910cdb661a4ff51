"""JetStream transport: one stream per swarm, a pull consumer per node.

Owns the JetStream side of the transport port: creating or updating the swarm's stream
idempotently, publishing with ``Nats-Msg-Id`` = rollout hash and waiting for the ack, and
pull consumers that survive a server restart. nats-py exceptions are translated into the
:class:`~sapo_async.errors.TransportError` family here and nowhere else.

Stream ``SAPO_<swarm>``: subjects ``sapo.<swarm>.rollouts.*`` (one subject per task family;
a wildcard so a new family needs no stream update, consumers filter by family), limits
retention, ``max_age``, ``max_bytes`` (oldest discarded), ``duplicate_window``,
``max_msg_size``, file storage.

Liveness (nats.py issue #504): a pull subscription can stop receiving after a server
restart while the connection says it reconnected. After ``CONSUMER_STALL_CHECKS`` empty
fetches in a row, the subscription asks the server for its consumer's info: a consumer
that is gone is re-created from the last stream sequence this subscription delivered (so
nothing is skipped; the collector drops what comes twice), and a consumer with messages
pending that we did not receive gets a fresh subscription bound to it.

Deliberately does not decode or verify payloads.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Self

import anyio
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from sapo_async.errors import PublishError, TransportError, TransportUnavailable
from sapo_async.fabric.transport.base import (
    PublishAck,
    PublishRefusedError,
    StartAt,
    rollouts_subject,
    validate_token,
)
from sapo_async.fabric.transport.embedded import NatsOptions, connect_nats, nats_endpoint
from sapo_async.limits import (
    CONSUMER_INACTIVE_THRESHOLD_S,
    CONSUMER_REPLACE_AFTER_FAILURES,
    CONSUMER_STALL_CHECKS,
    DUPLICATE_WINDOW_S,
    MAX_GROUP_BYTES,
    PUBLISH_ACK_TIMEOUT_S,
    STREAM_MAX_AGE_S,
    STREAM_MAX_BYTES,
)
from sapo_async.wire.rollout import SignedGroup
from sapo_async.wire.signing import encode_signed, rollout_hash

__all__ = [
    "JetStreamDelivery",
    "JetStreamSubscription",
    "JetStreamTransport",
    "StreamSettings",
    "open_jetstream",
    "stream_name",
]

# A lazy proxy (no .bind() at import): it follows configure_logging() called later.
_log = structlog.get_logger("jetstream", component="jetstream")

_TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
    OSError,
)
"""nats-py errors that mean "not now" rather than "never"."""


def stream_name(swarm: str) -> str:
    """The JetStream stream name of ``swarm``."""
    return f"SAPO_{validate_token(swarm, field='swarm')}"


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Limits of a swarm's stream.

    Attributes:
        max_age: seconds a message is kept.
        max_bytes: total bytes kept (oldest discarded first).
        duplicate_window: seconds a message id is remembered for de-duplication.
        max_msg_size: largest accepted message (envelope bytes).
        replicas: copies in a cluster (1 on a single server).
    """

    max_age: float = STREAM_MAX_AGE_S
    max_bytes: int = STREAM_MAX_BYTES
    duplicate_window: float = DUPLICATE_WINDOW_S
    max_msg_size: int = MAX_GROUP_BYTES + 1024
    replicas: int = 1


@dataclass(frozen=True, slots=True)
class JetStreamDelivery:
    """A message from a JetStream pull consumer (see ``base.Delivery``)."""

    data: bytes
    msg_id: str | None
    subject: str
    seq: int
    published_at: float
    _msg: Msg
    _unacked: dict[int, Msg]

    async def ack(self) -> None:
        """Acknowledge. A lost ack (server restarting) only means a redelivery later."""
        self._unacked.pop(self.seq, None)
        try:
            await self._msg.ack()
        except nats.errors.MsgAlreadyAckdError:
            pass
        except _TRANSIENT as exc:
            _log.info("ack_lost", seq=self.seq, error=repr(exc))


class JetStreamSubscription:
    """A pull consumer on the swarm stream that repairs itself after a server restart."""

    def __init__(
        self, transport: JetStreamTransport, name: str, config: api.ConsumerConfig
    ) -> None:
        self._transport = transport
        self._name = name
        self._config = config
        self._sub: JetStreamContext.PullSubscription | None = None
        self._last_seq = 0
        self._unacked: dict[int, Msg] = {}
        self._empty_fetches = 0
        self._check_failures = 0
        self._closed = False
        self.repairs = 0
        """How many times the subscription was re-created (tests and statistics read it)."""

    @property
    def name(self) -> str:
        """The consumer's name on the server."""
        return self._name

    async def _bind(self) -> None:
        js = self._transport.js
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except (nats.errors.Error, ValueError) as exc:
                _log.debug("stale_subscription_dropped", error=repr(exc))
        self._sub = await js.pull_subscribe_bind(consumer=self._name, stream=self._transport.stream)

    async def _create(self) -> None:
        await self._transport.js.add_consumer(self._transport.stream, config=self._config)
        await self._bind()

    async def fetch(self, max_messages: int, max_wait: float) -> list[JetStreamDelivery]:
        """See ``base.Subscription.fetch``; an unreachable server yields ``[]`` until back."""
        if self._closed or self._sub is None:
            raise TransportUnavailable(f"subscription {self._name} is closed")
        try:
            msgs = await self._sub.fetch(max_messages, timeout=max_wait)
        except (nats.errors.TimeoutError, TimeoutError):
            msgs = []
        except _TRANSIENT as exc:
            _log.debug("fetch_failed", consumer=self._name, error=repr(exc))
            msgs = []
            # A dead connection fails fast; do not spin on it.
            await anyio.sleep(min(max_wait, 0.2))
        except nats.js.errors.APIError as exc:
            raise TransportError(f"consumer {self._name} failed: {exc}") from exc
        if not msgs:
            self._empty_fetches += 1
            if self._empty_fetches >= CONSUMER_STALL_CHECKS:
                self._empty_fetches = 0
                await self._check_alive()
            return []
        self._empty_fetches = 0
        out = []
        for msg in msgs:
            meta = msg.metadata
            seq = meta.sequence.stream
            self._last_seq = max(self._last_seq, seq)
            self._unacked[seq] = msg
            out.append(
                JetStreamDelivery(
                    data=msg.data,
                    msg_id=(msg.headers or {}).get("Nats-Msg-Id"),
                    subject=msg.subject,
                    seq=seq,
                    published_at=meta.timestamp.timestamp(),
                    _msg=msg,
                    _unacked=self._unacked,
                )
            )
        return out

    async def _check_alive(self) -> None:
        """Ask the server whether our consumer exists and has work we are not getting."""
        jsm = self._transport.js
        try:
            info = await jsm.consumer_info(
                self._transport.stream, self._name, timeout=PUBLISH_ACK_TIMEOUT_S
            )
        except nats.js.errors.NotFoundError:
            await self._recreate()
            return
        except _TRANSIENT as exc:
            _log.debug("consumer_check_failed", consumer=self._name, error=repr(exc))
            return
        except nats.js.errors.APIError as exc:
            # The consumer exists in the cluster's metadata but cannot answer (its server
            # is gone and it has no replica to take over): replace it, resuming after the
            # last sequence we saw, so nothing is lost and nothing repeats.
            self._check_failures += 1
            _log.warning(
                "consumer_check_failed",
                consumer=self._name,
                error=repr(exc),
                failures=self._check_failures,
            )
            if self._check_failures >= CONSUMER_REPLACE_AFTER_FAILURES:
                await self._replace()
            return
        self._check_failures = 0
        if info.num_pending:
            # Messages wait for us and yet our fetches came back empty: the subscription
            # went silent (#504). Re-bind it; no pull request of ours is outstanding now, so
            # nothing is in flight to the old inbox.
            try:
                await self._bind()
            except _TRANSIENT as exc:
                _log.debug("consumer_rebind_failed", consumer=self._name, error=repr(exc))
                return
            self.repairs += 1
            _log.info("consumer_rebound", consumer=self._name, pending=info.num_pending)

    async def _replace(self) -> None:
        try:
            await self._transport.js.delete_consumer(self._transport.stream, self._name)
        except (nats.js.errors.APIError, *_TRANSIENT) as exc:
            _log.debug("consumer_delete_failed", consumer=self._name, error=repr(exc))
        if self._config.durable_name is None:
            # A fresh name: the old one may linger in the metadata until its server returns.
            self._name = f"sapo-{uuid.uuid4().hex[:16]}"
            self._config.name = self._name
        self._check_failures = 0
        await self._recreate()

    async def _recreate(self) -> None:
        if self._last_seq:
            self._config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            self._config.opt_start_seq = self._last_seq + 1
            self._config.opt_start_time = None
        try:
            await self._create()
        except _TRANSIENT as exc:
            _log.debug("consumer_recreate_failed", consumer=self._name, error=repr(exc))
            return
        except nats.js.errors.APIError as exc:
            raise TransportError(f"cannot re-create consumer {self._name}: {exc}") from exc
        self.repairs += 1
        _log.info("consumer_recreated", consumer=self._name, from_seq=self._last_seq + 1)

    async def aclose(self) -> None:
        """Stop consuming (idempotent); a durable consumer stays on the server.

        Messages fetched but not acked are handed back (nak) so the next subscriber gets
        them at once instead of after the server's ack wait.
        """
        if self._closed:
            return
        self._closed = True
        unacked, self._unacked = list(self._unacked.values()), {}
        for msg in unacked:
            try:
                await msg.nak()
            except (nats.errors.Error, OSError) as exc:
                _log.debug("nak_failed", error=repr(exc))
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except (nats.errors.Error, ValueError) as exc:
                _log.debug("unsubscribe_failed", error=repr(exc))


class JetStreamTransport:
    """A connection to one swarm's JetStream stream (see ``base.Transport``).

    Build with :meth:`connect` (opens and owns a connection) or from an existing client.

    Args:
        nc: a connected nats-py client.
        swarm: the swarm id.
        settings: the stream's limits.
        owns_connection: close ``nc`` in :meth:`aclose`.
    """

    def __init__(
        self,
        nc: NatsClient,
        swarm: str,
        *,
        settings: StreamSettings | None = None,
        owns_connection: bool = False,
    ) -> None:
        self._nc = nc
        self._swarm = validate_token(swarm, field="swarm")
        self.stream = stream_name(swarm)
        self.settings = settings or StreamSettings()
        self.js = nc.jetstream(timeout=PUBLISH_ACK_TIMEOUT_S)
        self._owns = owns_connection
        self._subs: list[JetStreamSubscription] = []
        self._closed = False

    @classmethod
    async def connect(
        cls, options: NatsOptions, swarm: str, *, settings: StreamSettings | None = None
    ) -> Self:
        """Connect, then create or update the swarm's stream.

        Raises:
            TransportUnavailable: the server cannot be reached.
            TransportError: the stream could not be created or updated.
        """
        nc = await connect_nats(options)
        transport = cls(nc, swarm, settings=settings, owns_connection=True)
        try:
            await transport.ensure_stream()
        except BaseException:
            await transport.aclose()
            raise
        return transport

    @property
    def swarm(self) -> str:
        """The swarm this connection publishes to and reads from."""
        return self._swarm

    @property
    def nc(self) -> NatsClient:
        """The underlying nats-py client (for benchmarks and diagnostics)."""
        return self._nc

    def _stream_config(self) -> api.StreamConfig:
        s = self.settings
        return api.StreamConfig(
            name=self.stream,
            subjects=[f"sapo.{self._swarm}.rollouts.*"],
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            max_age=s.max_age,
            max_bytes=s.max_bytes,
            duplicate_window=s.duplicate_window,
            max_msg_size=s.max_msg_size,
            storage=api.StorageType.FILE,
            num_replicas=s.replicas,
        )

    async def ensure_stream(self) -> None:
        """Create the stream, or update it to these settings; safe to call from every node.

        Raises:
            TransportError: the server refused both.
        """
        config = self._stream_config()
        try:
            try:
                await self.js.stream_info(self.stream)
            except nats.js.errors.NotFoundError:
                try:
                    await self.js.add_stream(config)
                except nats.js.errors.BadRequestError:
                    pass  # another node created it meanwhile, with other settings: update
                else:
                    _log.info("stream_created", stream=self.stream)
                    return
            await self.js.update_stream(config)
            _log.debug("stream_updated", stream=self.stream)
        except nats.js.errors.APIError as exc:
            raise TransportError(f"cannot create or update stream {self.stream}: {exc}") from exc
        except _TRANSIENT as exc:
            raise TransportUnavailable(f"cannot reach JetStream: {exc!r}") from exc

    async def publish(self, signed: SignedGroup, *, family: str) -> PublishAck:
        """See ``base.Transport.publish``.

        Raises:
            PublishRefusedError: the server refused the message for good (e.g. too large).
            PublishError: no ack in time (safe to retry: the message id de-duplicates).
            TransportUnavailable: this transport was closed.
        """
        subject = rollouts_subject(self._swarm, family)
        if self._closed:
            raise TransportUnavailable("transport is closed")
        data = encode_signed(signed)
        msg_id = rollout_hash(signed.body).hex()
        if len(data) > self.settings.max_msg_size:
            raise PublishRefusedError(
                f"message of {len(data)} bytes exceeds max_msg_size {self.settings.max_msg_size}",
                rollout_hash=msg_id,
            )
        try:
            ack = await self.js.publish(
                subject,
                data,
                timeout=PUBLISH_ACK_TIMEOUT_S,
                stream=self.stream,
                headers={"Nats-Msg-Id": msg_id},
            )
        except nats.js.errors.ServiceUnavailableError as exc:
            raise PublishError(f"JetStream unavailable: {exc}", rollout_hash=msg_id) from exc
        except nats.js.errors.APIError as exc:
            raise PublishRefusedError(f"publish refused: {exc}", rollout_hash=msg_id) from exc
        except (nats.errors.MaxPayloadError, nats.errors.BadSubjectError) as exc:
            raise PublishRefusedError(f"publish refused: {exc!r}", rollout_hash=msg_id) from exc
        except _TRANSIENT as exc:
            raise PublishError(f"publish not acknowledged: {exc!r}", rollout_hash=msg_id) from exc
        return PublishAck(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def subscribe(
        self,
        *,
        families: Sequence[str] | None = None,
        start: StartAt | None = None,
        durable: str | None = None,
    ) -> JetStreamSubscription:
        """See ``base.Transport.subscribe``.

        A durable consumer is named ``durable`` and kept by the server; otherwise the name
        is random and the server removes it after ``CONSUMER_INACTIVE_THRESHOLD_S`` unused.
        """
        if self._closed:
            raise TransportUnavailable("transport is closed")
        subjects = (
            [f"sapo.{self._swarm}.rollouts.*"]
            if families is None
            else [rollouts_subject(self._swarm, f) for f in families]
        )
        if durable is not None:
            name = validate_token(durable, field="durable")
        else:
            name = f"sapo-{uuid.uuid4().hex[:16]}"
        config = api.ConsumerConfig(
            name=name,
            durable_name=name if durable is not None else None,
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subjects=subjects if len(subjects) > 1 else None,
            filter_subject=subjects[0] if len(subjects) == 1 else None,
            inactive_threshold=None if durable is not None else CONSUMER_INACTIVE_THRESHOLD_S,
            max_ack_pending=-1,
            # As many replicas as the stream: on a cluster an R1 consumer dies with its one
            # server, and the node would stop receiving although the stream survived.
            num_replicas=self.settings.replicas,
        )
        start = start or StartAt.new()
        if start.lookback_s is None:
            config.deliver_policy = api.DeliverPolicy.NEW
        elif math.isinf(start.lookback_s):
            config.deliver_policy = api.DeliverPolicy.ALL
        else:
            config.deliver_policy = api.DeliverPolicy.BY_START_TIME
            config.opt_start_time = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=start.lookback_s)
        sub = JetStreamSubscription(self, name, config)
        try:
            exists = False
            if durable is not None:
                try:
                    info = await self.js.consumer_info(self.stream, name)
                    exists = True
                except nats.js.errors.NotFoundError:
                    pass
                else:
                    have = sorted(info.config.filter_subjects or [info.config.filter_subject])
                    if have != sorted(subjects):
                        raise TransportError(
                            f"durable consumer {name!r} exists for {have}, not {sorted(subjects)}"
                        )
            if exists:
                await sub._bind()
            else:
                await sub._create()
        except nats.js.errors.APIError as exc:
            raise TransportError(f"cannot create consumer {name}: {exc}") from exc
        except _TRANSIENT as exc:
            raise TransportUnavailable(f"cannot reach JetStream: {exc!r}") from exc
        self._subs.append(sub)
        return sub

    async def aclose(self) -> None:
        """Close subscriptions and, if owned, the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for sub in self._subs:
                await sub.aclose()
            if self._owns:
                try:
                    await self._nc.close()
                except nats.errors.Error as exc:
                    _log.debug("close_failed", error=repr(exc))


@contextlib.asynccontextmanager
async def open_jetstream(
    swarm: str, options: NatsOptions | None = None, *, settings: StreamSettings | None = None
) -> AsyncIterator[JetStreamTransport]:
    """Yield a JetStream transport for ``swarm``: at ``options.url``, or, with no URL, on a
    private embedded nats-server that is stopped when the block exits.

    Raises:
        TransportUnavailable: the server cannot be reached or started.
        TransportError: the stream could not be created or updated.
    """
    async with nats_endpoint(options or NatsOptions()) as resolved:
        transport = await JetStreamTransport.connect(resolved, swarm, settings=settings)
        try:
            yield transport
        finally:
            await transport.aclose()
