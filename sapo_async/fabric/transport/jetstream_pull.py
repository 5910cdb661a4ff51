"""JetStream pull consumers that repair themselves, and the messages they deliver.

Owns the consumer side of the JetStream transport: fetching, acks (a lost ack only means a
redelivery), handing unacked messages back on close, and liveness. nats-py exceptions met
while consuming are translated into the :class:`~sapo_async.errors.TransportError` family
here.

Liveness (nats.py issue #504): a pull subscription can stop receiving after a server
restart while the connection says it reconnected. After ``CONSUMER_STALL_CHECKS`` empty
fetches in a row, the subscription asks the server for its consumer's info: a consumer
that is gone is re-created from the last stream sequence this subscription delivered (so
nothing is skipped; the collector drops what comes twice), and a consumer with messages
pending that we did not receive gets a fresh subscription bound to it.

Repair never ends the subscription: a re-creation the server refuses (the stream is gone
for a while, the account is at its consumer limit, the consumer was deleted again) is
counted, logged and tried again with jittered backoff (:data:`CONSUMER_REPAIR_BACKOFF`,
``CONSUMER_REPAIR_BASE_S`` doubling to ``CONSUMER_REPAIR_MAX_S``); meanwhile ``fetch``
returns nothing after waiting, as on a quiet stream. Only closing ends it.

Deliberately does not decode or verify payloads, nor choose the consumer's settings (see
``jetstream_admin.consumer_config``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from sapo_async.backoff import Backoff
from sapo_async.errors import TransportUnavailable
from sapo_async.fabric.transport.jetstream_admin import TRANSIENT
from sapo_async.limits import (
    CONSUMER_REPAIR_BASE_S,
    CONSUMER_REPAIR_MAX_S,
    CONSUMER_REPLACE_AFTER_FAILURES,
    CONSUMER_STALL_CHECKS,
    EPHEMERAL_DELETE_TIMEOUT_S,
    PUBLISH_ACK_TIMEOUT_S,
    RETRY_JITTER,
)
from sapo_async.logs import get_logger

__all__ = ["JetStreamDelivery", "JetStreamSubscription"]

_log = get_logger("jetstream")

CONSUMER_REPAIR_BACKOFF = Backoff(
    CONSUMER_REPAIR_BASE_S, CONSUMER_REPAIR_MAX_S, jitter=RETRY_JITTER
)
"""When a refused consumer re-creation is tried again: a due time its next fetch checks (the
repair is not a loop of its own, so it takes the schedule, not ``retry_async``)."""


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
        except TRANSIENT as exc:
            _log.info("ack_lost", seq=self.seq, error=repr(exc))


class JetStreamSubscription:
    """A pull consumer on the swarm stream that repairs itself after a server restart.

    Args:
        js: the JetStream context of the transport's connection.
        stream: the swarm's stream.
        config: the consumer (see ``jetstream_admin.consumer_config``); named by its name.
        rename: where a replacement consumer's name comes from (an owned name that is free
            now); None: a fresh random name.
    """

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        config: api.ConsumerConfig,
        *,
        rename: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._js = js
        self._rename = rename
        self._stream = stream
        self._name = config.name or ""
        self._config = config
        self._sub: JetStreamContext.PullSubscription | None = None
        self._last_seq = 0
        self._unacked: dict[int, Msg] = {}
        self._empty_fetches = 0
        self._check_failures = 0
        self._closed = False
        self._repair_attempt = 0
        self._repair_due: float | None = None  # monotonic time of the next re-creation try
        self.repairs = 0
        """How many times the subscription was re-created (tests and statistics read it)."""
        self.repair_failures = 0
        """Re-creations the server refused or did not answer (each retried with backoff)."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    @property
    def name(self) -> str:
        """The consumer's name on the server."""
        return self._name

    async def bind(self) -> None:
        """Attach to the existing consumer (dropping a stale subscription first)."""
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except (nats.errors.Error, ValueError) as exc:
                _log.debug("stale_subscription_dropped", error=repr(exc))
        self._sub = await self._js.pull_subscribe_bind(consumer=self._name, stream=self._stream)

    async def create(self) -> None:
        """Create the consumer on the server, then attach to it."""
        await self._js.add_consumer(self._stream, config=self._config)
        await self.bind()

    async def fetch(self, max_messages: int, max_wait: float) -> list[JetStreamDelivery]:
        """See ``base.Subscription.fetch``; an unreachable server yields ``[]`` until back."""
        if self._closed or self._sub is None:
            raise TransportUnavailable(f"subscription {self._name} is closed")
        if self._repair_due is not None:
            wait = self._repair_due - time.monotonic()
            if wait > 0:
                # Backing off a refused repair: behave like a quiet stream meanwhile.
                await anyio.sleep(min(wait, max_wait))
                return []
            await self._recreate()
            if self._repair_due is not None:
                return []
        try:
            msgs = await self._sub.fetch(max_messages, timeout=max_wait)
        except (nats.errors.TimeoutError, TimeoutError):
            msgs = []
        except TRANSIENT as exc:
            _log.debug("fetch_failed", consumer=self._name, error=repr(exc))
            msgs = []
            # A dead connection fails fast; do not spin on it.
            await anyio.sleep(min(max_wait, 0.2))
        except nats.js.errors.APIError as exc:
            # The server refused the pull (the consumer was deleted or broken): check it
            # now and repair, instead of ending the subscription and the node with it.
            _log.info("fetch_refused", consumer=self._name, error=repr(exc))
            self._empty_fetches = 0
            await self._check_alive()
            return []
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
        try:
            info = await self._js.consumer_info(
                self._stream, self._name, timeout=PUBLISH_ACK_TIMEOUT_S
            )
        except nats.js.errors.NotFoundError:
            await self._recreate()
            return
        except TRANSIENT as exc:
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
                await self.bind()
            except TRANSIENT as exc:
                _log.debug("consumer_rebind_failed", consumer=self._name, error=repr(exc))
                return
            self.repairs += 1
            _log.info("consumer_rebound", consumer=self._name, pending=info.num_pending)

    async def _replace(self) -> None:
        try:
            await self._js.delete_consumer(self._stream, self._name)
        except (nats.js.errors.APIError, *TRANSIENT) as exc:
            _log.debug("consumer_delete_failed", consumer=self._name, error=repr(exc))
        if self._config.durable_name is None:
            # A fresh name: the old one may linger in the metadata until its server returns.
            if self._rename is None:
                self._name = f"sapo-{uuid.uuid4().hex[:16]}"
            else:
                try:
                    self._name = await self._rename()
                except TransportUnavailable as exc:
                    _log.warning("consumer_rename_failed", consumer=self._name, error=str(exc))
                    return  # the next failed check tries again
            self._config.name = self._name
        self._check_failures = 0
        await self._recreate()

    async def _recreate(self) -> None:
        try:
            if self._last_seq:
                info = await self._js.stream_info(self._stream)
                if info.state.last_seq < self._last_seq:
                    # The stream was deleted and created again (its sequences restarted):
                    # everything in it is new to us.
                    self._last_seq = 0
                    self._config.deliver_policy = api.DeliverPolicy.ALL
                    self._config.opt_start_seq = None
                else:
                    self._config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
                    self._config.opt_start_seq = self._last_seq + 1
                self._config.opt_start_time = None
            await self.create()
        except (nats.js.errors.APIError, *TRANSIENT) as exc:
            delay = CONSUMER_REPAIR_BACKOFF.delay(self._repair_attempt)
            self._repair_attempt += 1
            self._repair_due = time.monotonic() + delay
            self.repair_failures += 1
            _log.warning(
                "consumer_recreate_failed",
                consumer=self._name,
                error=repr(exc),
                attempt=self._repair_attempt,
                retry_in_s=delay,
            )
            return
        self._repair_attempt = 0
        self._repair_due = None
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
        if self._config.durable_name is None:
            # An ephemeral consumer is of no use to anyone once closed: delete it now
            # rather than after the server's inactivity threshold, so a node that
            # rotates shards leaves one consumer on the server, not one per epoch.
            with anyio.move_on_after(EPHEMERAL_DELETE_TIMEOUT_S):
                try:
                    await self._js.delete_consumer(self._stream, self._name)
                except (nats.js.errors.APIError, *TRANSIENT) as exc:
                    _log.debug("consumer_delete_failed", consumer=self._name, error=repr(exc))
