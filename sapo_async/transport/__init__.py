"""The transport port: base protocol, in-memory and JetStream backends, embedded server."""

from sapo_async.transport.base import (
    Delivery,
    PublishAck,
    PublishRefusedError,
    StartAt,
    Subscription,
    Transport,
    rollouts_subject,
)
from sapo_async.transport.embedded import (
    EmbeddedNats,
    NatsOptions,
    connect_nats,
    find_nats_server,
    nats_endpoint,
)
from sapo_async.transport.jetstream import (
    JetStreamTransport,
    StreamSettings,
    open_jetstream,
    stream_name,
)
from sapo_async.transport.memory import MemoryBroker, MemoryTransport

__all__ = [
    "Delivery",
    "EmbeddedNats",
    "JetStreamTransport",
    "MemoryBroker",
    "MemoryTransport",
    "NatsOptions",
    "PublishAck",
    "PublishRefusedError",
    "StartAt",
    "StreamSettings",
    "Subscription",
    "Transport",
    "connect_nats",
    "find_nats_server",
    "nats_endpoint",
    "open_jetstream",
    "rollouts_subject",
    "stream_name",
]
