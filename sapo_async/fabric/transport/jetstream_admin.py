"""JetStream settings and management: the swarm's stream, its consumers, the account.

Owns what the JetStream transport asks the server to keep: stream ``SAPO_<swarm>`` on
subjects ``sapo.<swarm>.rollouts.>`` (a subject per task family and producer leaf, see
``shards``; a wildcard so a new family needs no stream update, consumers filter by family
and shard; it holds the legacy ``rollouts.<family>`` subjects too, so a stream made before
sharding is updated in place, its messages kept) with limits retention,
``max_age``, ``max_bytes`` (oldest discarded), ``duplicate_window``, ``max_msg_size`` and
file storage; creating that stream when it is missing (an existing stream belongs to whoever
created it, normally the swarm's operator: volunteers' credentials may not update, purge or
delete it, see infra/nats/accounts.conf); the pull-consumer
configuration for a start point; and reading the account's JetStream status (doctor).
nats-py's management errors are translated into the
:class:`~sapo_async.errors.TransportError` family here.

Deliberately does not publish or fetch (see ``jetstream.py`` and ``jetstream_pull.py``).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.client import JetStreamContext

from sapo_async.errors import TransportError, TransportUnavailable
from sapo_async.fabric.transport.base import StartAt, rollouts_subject, validate_token
from sapo_async.fabric.transport.shards import ShardSet, shard_filters
from sapo_async.limits import (
    CONSUMER_INACTIVE_THRESHOLD_S,
    CONSUMER_SLOTS,
    DUPLICATE_WINDOW_S,
    MAX_GROUP_BYTES,
    STREAM_MAX_AGE_S,
    STREAM_MAX_BYTES,
)
from sapo_async.logs import get_logger

__all__ = [
    "TRANSIENT",
    "AccountStatus",
    "StreamSettings",
    "account_status",
    "consumer_config",
    "ensure_stream",
    "free_consumer_name",
    "owned_consumer_names",
    "stream_config",
    "stream_name",
    "widen_consumer",
]

_log = get_logger("jetstream")

TRANSIENT = (
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


def stream_config(swarm: str, settings: StreamSettings) -> api.StreamConfig:
    return api.StreamConfig(
        name=stream_name(swarm),
        subjects=[f"sapo.{swarm}.rollouts.>"],
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        max_age=settings.max_age,
        max_bytes=settings.max_bytes,
        duplicate_window=settings.duplicate_window,
        max_msg_size=settings.max_msg_size,
        storage=api.StorageType.FILE,
        num_replicas=settings.replicas,
    )


_COMPARED = (
    "subjects",
    "max_age",
    "max_bytes",
    "max_msg_size",
    "duplicate_window",
    "num_replicas",
)


def owned_consumer_names(owner: str) -> list[str]:
    """The consumer names a credential bound to ``owner`` may use (its broker permissions
    name exactly these: ``infra/nats/gen_permissions.py``).

    Raises:
        ConfigError: ``owner`` is not a valid subject token.
    """
    owner = validate_token(owner, field="nats.consumer_owner")
    return [f"{owner}-{k}" for k in range(CONSUMER_SLOTS)]


async def free_consumer_name(
    js: JetStreamContext, stream: str, owner: str, *, taken: Collection[str] = ()
) -> str:
    """An owned consumer name no consumer on ``stream`` holds now (nor one in ``taken``).

    Raises:
        TransportUnavailable: every owned name is held (an old consumer frees its name
            within ``CONSUMER_INACTIVE_THRESHOLD_S``), or JetStream cannot be reached.
    """
    for name in owned_consumer_names(owner):
        if name in taken:
            continue
        try:
            await js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            return name
        except TRANSIENT as exc:
            raise TransportUnavailable(f"cannot reach JetStream: {exc!r}") from exc
    raise TransportUnavailable(
        f"all {CONSUMER_SLOTS} consumer names of owner {owner!r} are in use on {stream}; "
        f"an unused one is freed within {CONSUMER_INACTIVE_THRESHOLD_S:.0f} s"
    )


async def ensure_stream(js: JetStreamContext, swarm: str, settings: StreamSettings) -> None:
    """Create ``swarm``'s stream if it is missing; safe to call from every node.

    An existing stream is used as it is, never updated: it belongs to whoever created it
    (the operator, in a real swarm; a volunteer's credential may not change it). Settings
    that differ from ``settings`` are logged (``stream_settings_differ``).

    Raises:
        TransportError: the stream is missing and the server refused to create it.
        TransportUnavailable: JetStream cannot be reached, or the stream is missing and this
            credential may not create it (the server does not answer a refused request).
    """
    stream = stream_name(swarm)
    config = stream_config(swarm, settings)
    try:
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError:
                info = await js.stream_info(stream)  # another node created it meanwhile
            else:
                _log.info("stream_created", stream=stream)
                return
        differ = {
            name: getattr(info.config, name)
            for name in _COMPARED
            if getattr(info.config, name) != getattr(config, name)
        }
        if differ:
            _log.info("stream_settings_differ", stream=stream, **differ)
    except nats.js.errors.APIError as exc:
        raise TransportError(f"cannot create stream {stream}: {exc}") from exc
    except TRANSIENT as exc:
        raise TransportUnavailable(f"cannot reach JetStream: {exc!r}") from exc


def consumer_config(
    swarm: str,
    *,
    families: Sequence[str] | None,
    start: StartAt,
    durable: str | None,
    replicas: int,
    shards: ShardSet | None = None,
    name: str | None = None,
) -> api.ConsumerConfig:
    """The pull consumer for ``families`` (all when ``None``) in ``shards`` (all when
    ``None``) from ``start``.

    A durable consumer is named ``durable`` and kept by the server; otherwise the name is
    ``name`` (an owned name, see :func:`owned_consumer_names`) or random, and the server
    removes it after ``CONSUMER_INACTIVE_THRESHOLD_S`` unused.

    Raises:
        ConfigError: a family or ``durable`` is not a valid subject token.
    """
    for family in families or ():
        rollouts_subject(swarm, family)  # validates the token
    subjects = shard_filters(swarm, families, shards or ShardSet.everything())
    if durable is not None:
        name = validate_token(durable, field="durable")
    elif name is None:
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
        num_replicas=replicas,
    )
    if start.lookback_s is None:
        config.deliver_policy = api.DeliverPolicy.NEW
    elif math.isinf(start.lookback_s):
        config.deliver_policy = api.DeliverPolicy.ALL
    else:
        config.deliver_policy = api.DeliverPolicy.BY_START_TIME
        config.opt_start_time = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=start.lookback_s)
    return config


def consumer_subjects(config: api.ConsumerConfig) -> list[str]:
    """The subjects a consumer configuration filters on, sorted."""
    return sorted(config.filter_subjects or [config.filter_subject or ""])


async def widen_consumer(
    js: JetStreamContext, stream: str, config: api.ConsumerConfig, subjects: list[str]
) -> None:
    """Update an existing consumer to filter on ``subjects`` (a superset of its own),
    keeping its position: how a durable consumer made before sharding moves on.

    Raises:
        nats.js.errors.APIError: the server refused (the caller translates it).
    """
    config.filter_subjects = subjects if len(subjects) > 1 else None
    config.filter_subject = subjects[0] if len(subjects) == 1 else None
    await js.add_consumer(stream, config=config)
    _log.info("consumer_widened", consumer=config.name or config.durable_name, subjects=subjects)


@dataclass(frozen=True, slots=True)
class AccountStatus:
    """The account's JetStream usage.

    Attributes:
        streams: how many streams the account has.
        storage: bytes stored on file.
    """

    streams: int
    storage: int


async def account_status(nc: NatsClient, *, request_timeout: float) -> AccountStatus:
    """Ask the server for this account's JetStream usage.

    Args:
        nc: a connected client.
        request_timeout: seconds the server has to answer the JetStream API request.

    Raises:
        TransportUnavailable: JetStream is not enabled for the account (nobody answers).
        TransportError: JetStream refused the request.
    """
    try:
        info = await nc.jetstream(timeout=request_timeout).account_info()
    except (
        nats.errors.NoRespondersError,
        nats.js.errors.ServiceUnavailableError,
        nats.errors.TimeoutError,
    ) as exc:
        raise TransportUnavailable(
            f"JetStream is not enabled for this account ({type(exc).__name__})"
        ) from exc
    except nats.js.errors.APIError as exc:
        raise TransportError(f"JetStream refused: {exc}") from exc
    return AccountStatus(streams=int(info.streams), storage=int(info.storage))
