"""JetStream transport: one stream per swarm, a pull consumer per node.

Owns the JetStream adapter of the transport port: a connection to one swarm's stream
(created on connect when missing, otherwise used as its owner set it, see
:mod:`.jetstream_admin`), publishing with
``Nats-Msg-Id`` = rollout hash and waiting for the ack, and handing out self-repairing pull
consumers (:mod:`.jetstream_pull`). nats-py's publish errors are translated into the
:class:`~sapo_async.errors.TransportError` family here.

Deliberately does not decode or verify payloads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Self

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from sapo_async.errors import (
    PublishError,
    PublishRefused,
    StreamMissing,
    TransportError,
    TransportUnavailable,
)
from sapo_async.fabric.transport.base import (
    PublishAck,
    StartAt,
    message_id,
    rollouts_subject,
    validate_token,
)
from sapo_async.fabric.transport.embedded import NatsOptions, connect_nats, nats_endpoint
from sapo_async.fabric.transport.jetstream_admin import (
    TRANSIENT,
    StreamSettings,
    consumer_config,
    consumer_subjects,
    ensure_stream,
    free_consumer_name,
    stream_config,
    stream_name,
    widen_consumer,
)
from sapo_async.fabric.transport.jetstream_pull import JetStreamDelivery, JetStreamSubscription
from sapo_async.fabric.transport.shards import ShardSet, publish_subject, subject_matches
from sapo_async.limits import PUBLISH_ACK_TIMEOUT_S, STREAM_CREATE_TIMEOUT_S, STREAM_RECHECK_S
from sapo_async.logs import get_logger
from sapo_async.wire.rollout import SignedGroup
from sapo_async.wire.signing import encode_signed

__all__ = [
    "JetStreamDelivery",
    "JetStreamSubscription",
    "JetStreamTransport",
    "StreamSettings",
    "open_jetstream",
    "stream_name",
]

_log = get_logger("jetstream")


class JetStreamTransport:
    """A connection to one swarm's JetStream stream (see ``base.Transport``).

    Build with :meth:`connect` (opens and owns a connection) or from an existing client.

    Args:
        nc: a connected nats-py client.
        swarm: the swarm id.
        settings: the stream's limits.
        owns_connection: close ``nc`` in :meth:`aclose`.
        consumer_owner: name non-durable consumers ``<owner>-<k>`` (the names a credential
            bound to that owner may use); None: random names.
    """

    def __init__(
        self,
        nc: NatsClient,
        swarm: str,
        *,
        settings: StreamSettings | None = None,
        owns_connection: bool = False,
        consumer_owner: str | None = None,
    ) -> None:
        self._nc = nc
        self._owner = consumer_owner
        self._swarm = validate_token(swarm, field="swarm")
        self.stream = stream_name(swarm)
        self.settings = settings or StreamSettings()
        self.js = nc.jetstream(timeout=PUBLISH_ACK_TIMEOUT_S)
        self._owns = owns_connection
        self._subs: list[JetStreamSubscription] = []
        self._leaves = True  # publish on producer leaves (see _learn_subjects)
        self._closed = False
        self._missing_since: float | None = None  # the stream was found deleted (monotonic)
        self._next_recheck = 0.0
        self._may_create: bool | None = None  # learnt when recreating the stream is tried

    @classmethod
    async def connect(
        cls, options: NatsOptions, swarm: str, *, settings: StreamSettings | None = None
    ) -> Self:
        """Connect, then create the swarm's stream if it is missing.

        Raises:
            TransportUnavailable: the server cannot be reached.
            TransportError: the stream could not be created.
        """
        nc = await connect_nats(options)
        transport = cls(
            nc,
            swarm,
            settings=settings,
            owns_connection=True,
            consumer_owner=options.consumer_owner,
        )
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
    def leaves(self) -> bool:
        """See ``base.Transport.leaves``: learned from the stream's subjects on connect."""
        return self._leaves

    @property
    def stream_missing(self) -> bool:
        """Whether the swarm's stream is known deleted (publishes fail at once meanwhile)."""
        return self._missing_since is not None

    @property
    def nc(self) -> NatsClient:
        """The underlying nats-py client (for benchmarks and diagnostics)."""
        return self._nc

    async def ensure_stream(self) -> None:
        """Create the stream if it is missing (an existing one is left as it is); safe to
        call from every node.

        Raises:
            TransportError: the server refused to create it.
            TransportUnavailable: JetStream cannot be reached.
        """
        await ensure_stream(self.js, self._swarm, self.settings)
        await self._learn_subjects()

    async def _learn_subjects(self) -> None:
        """Publish on leaves only if the stream takes them.

        A stream made before sharding, on ``rollouts.*``, that this credential may not
        widen (an operator's stream) would refuse every leaf subject: publishing on the
        legacy family subject keeps the swarm working (whole-swarm readers read it) until
        the operator widens the stream to ``rollouts.>``.
        """
        try:
            info = await self.js.stream_info(self.stream)
        except (nats.js.errors.APIError, *TRANSIENT) as exc:
            _log.debug("stream_subjects_unknown", stream=self.stream, error=repr(exc))
            return
        probe = f"sapo.{self._swarm}.rollouts.x.0.0.0"
        self._leaves = any(subject_matches(s, probe) for s in info.config.subjects or [])
        if not self._leaves:
            _log.warning(
                "stream_not_sharded",
                stream=self.stream,
                subjects=info.config.subjects,
                fix=f"nats stream edit {self.stream} --subjects 'sapo.{self._swarm}.rollouts.>'",
            )

    async def publish(
        self,
        signed: SignedGroup,
        *,
        family: str,
        producer: str | None = None,
        rollout_hash: bytes | None = None,
    ) -> PublishAck:
        """See ``base.Transport.publish``."""
        subject = rollouts_subject(self._swarm, family)
        if self._leaves:
            subject = publish_subject(subject, family, signed.body, producer)
        if self._closed:
            raise TransportUnavailable("transport is closed")
        data = encode_signed(signed)
        msg_id = message_id(signed, rollout_hash)
        if len(data) > self.settings.max_msg_size:
            raise PublishRefused(
                f"message of {len(data)} bytes exceeds max_msg_size {self.settings.max_msg_size}",
                rollout_hash=msg_id,
            )
        if self._missing_since is not None and not await self._stream_back():
            raise StreamMissing(f"stream {self.stream} is missing", rollout_hash=msg_id)
        try:
            try:
                ack = await self._publish_once(subject, data, msg_id)
            except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
                # Nothing stores this subject: the stream may have been deleted under us.
                if not await self._stream_deleted():
                    raise
                if not await self._recreate_stream():
                    raise StreamMissing(
                        f"stream {self.stream} was deleted and this credential may not recreate it",
                        rollout_hash=msg_id,
                    ) from None
                ack = await self._publish_once(subject, data, msg_id)
        except nats.js.errors.ServiceUnavailableError as exc:
            raise PublishError(f"JetStream unavailable: {exc}", rollout_hash=msg_id) from exc
        except nats.js.errors.APIError as exc:
            raise PublishRefused(f"publish refused: {exc}", rollout_hash=msg_id) from exc
        except (nats.errors.MaxPayloadError, nats.errors.BadSubjectError) as exc:
            raise PublishRefused(f"publish refused: {exc!r}", rollout_hash=msg_id) from exc
        except TRANSIENT as exc:
            raise PublishError(f"publish not acknowledged: {exc!r}", rollout_hash=msg_id) from exc
        return PublishAck(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def _publish_once(self, subject: str, data: bytes, msg_id: str) -> Any:
        return await self.js.publish(
            subject,
            data,
            timeout=PUBLISH_ACK_TIMEOUT_S,
            stream=self.stream,
            headers={"Nats-Msg-Id": msg_id},
        )

    async def _stream_deleted(self) -> bool:
        """Whether the server says the stream does not exist (not merely unreachable)."""
        try:
            with anyio.fail_after(STREAM_CREATE_TIMEOUT_S):
                await self.js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            return True
        except (nats.js.errors.APIError, TimeoutError, *TRANSIENT):
            return False
        return False

    async def _recreate_stream(self) -> bool:
        """Recreate the deleted stream where this credential may (the embedded server);
        else note it missing. Returns whether it exists again."""
        if self._may_create is not False:
            try:
                with anyio.fail_after(STREAM_CREATE_TIMEOUT_S):
                    await self.js.add_stream(stream_config(self._swarm, self.settings))
            except nats.js.errors.BadRequestError:  # another node recreated it meanwhile
                self._missing_since = None
                return True
            except (nats.js.errors.APIError, TimeoutError, *TRANSIENT) as exc:
                # A refused request gets no answer (a permission violation): a timeout.
                self._may_create = False
                _log.debug("stream_recreate_refused", stream=self.stream, error=repr(exc))
            else:
                self._may_create = True
                _log.warning("stream_recreated", stream=self.stream)
                self._missing_since = None
                return True
        if self._missing_since is None:
            self._missing_since = time.monotonic()
            _log.warning(
                "stream_missing",
                stream=self.stream,
                fix="the swarm's operator recreates it; the node trains on its own groups",
            )
        self._next_recheck = time.monotonic() + STREAM_RECHECK_S
        return False

    async def _stream_back(self) -> bool:
        """While the stream is missing: look again at most every ``STREAM_RECHECK_S``."""
        if time.monotonic() < self._next_recheck:
            return False
        if await self._stream_deleted():
            return await self._recreate_stream()
        assert self._missing_since is not None
        _log.info(
            "stream_restored",
            stream=self.stream,
            missing_s=round(time.monotonic() - self._missing_since, 1),
        )
        self._missing_since = None
        return True

    async def subscribe(
        self,
        *,
        families: Sequence[str] | None = None,
        start: StartAt | None = None,
        durable: str | None = None,
        shards: ShardSet | None = None,
    ) -> JetStreamSubscription:
        """See ``base.Transport.subscribe``.

        A durable consumer is named ``durable`` and kept by the server; otherwise the name
        is random and the server deletes it when the subscription closes (or after
        ``CONSUMER_INACTIVE_THRESHOLD_S`` unused, if the node died). A durable consumer
        made before sharding (filter ``rollouts.<family>``) is widened in place to the
        sharded filters, keeping its position.
        """
        if self._closed:
            raise TransportUnavailable("transport is closed")
        name = durable or (f"of owner {self._owner}" if self._owner else "(new)")
        try:
            owned = None
            if self._owner is not None and durable is None:
                owned = await self._free_name()
            config = consumer_config(
                self._swarm,
                families=families,
                start=start or StartAt.new(),
                durable=durable,
                replicas=self.settings.replicas,
                shards=shards,
                name=owned,
            )
            name = config.name or name
            rename = self._free_name if owned is not None else None
            sub = JetStreamSubscription(self.js, self.stream, config, rename=rename)
            exists = False
            if durable is not None:
                try:
                    info = await self.js.consumer_info(self.stream, durable)
                    exists = True
                except nats.js.errors.NotFoundError:
                    pass
                else:
                    have, want = consumer_subjects(info.config), consumer_subjects(config)
                    if have != want and set(have) < set(want):
                        await widen_consumer(self.js, self.stream, info.config, want)
                    elif have != want:
                        raise TransportError(
                            f"durable consumer {durable!r} exists for {have}, not {want}"
                        )
            if exists:
                await sub.bind()
            else:
                await sub.create()
        except nats.js.errors.APIError as exc:
            raise TransportError(f"cannot create consumer {name}: {exc}") from exc
        except TRANSIENT as exc:
            raise TransportUnavailable(f"cannot reach JetStream: {exc!r}") from exc
        self._subs.append(sub)
        return sub

    async def _free_name(self) -> str:
        """An owned consumer name no consumer holds now, nor one of this connection's."""
        assert self._owner is not None
        taken = {s.name for s in self._subs if not s.closed}
        return await free_consumer_name(self.js, self.stream, self._owner, taken=taken)

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
        TransportError: the stream could not be created.
    """
    async with nats_endpoint(options or NatsOptions()) as resolved:
        transport = await JetStreamTransport.connect(resolved, swarm, settings=settings)
        try:
            yield transport
        finally:
            await transport.aclose()
