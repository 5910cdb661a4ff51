"""The transport port: base protocol, in-memory and JetStream backends, nats-server.

Names load on first use (:mod:`sapo_async._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports

if TYPE_CHECKING:
    from sapo_async.fabric.transport.base import (
        Delivery,
        PublishAck,
        StartAt,
        Subscription,
        Transport,
        rollouts_subject,
    )
    from sapo_async.fabric.transport.embedded import (
        EmbeddedNats,
        NatsOptions,
        connect_nats,
        nats_endpoint,
    )
    from sapo_async.fabric.transport.jetstream import (
        JetStreamTransport,
        StreamSettings,
        open_jetstream,
        stream_name,
    )
    from sapo_async.fabric.transport.memory import MemoryBroker, MemoryTransport
    from sapo_async.fabric.transport.server import NatsServer, find_nats_server, spawn_nats_server

_LAZY = {
    "Delivery": "sapo_async.fabric.transport.base",
    "EmbeddedNats": "sapo_async.fabric.transport.embedded",
    "JetStreamTransport": "sapo_async.fabric.transport.jetstream",
    "MemoryBroker": "sapo_async.fabric.transport.memory",
    "MemoryTransport": "sapo_async.fabric.transport.memory",
    "NatsOptions": "sapo_async.fabric.transport.embedded",
    "NatsServer": "sapo_async.fabric.transport.server",
    "PublishAck": "sapo_async.fabric.transport.base",
    "StartAt": "sapo_async.fabric.transport.base",
    "StreamSettings": "sapo_async.fabric.transport.jetstream",
    "Subscription": "sapo_async.fabric.transport.base",
    "Transport": "sapo_async.fabric.transport.base",
    "connect_nats": "sapo_async.fabric.transport.embedded",
    "find_nats_server": "sapo_async.fabric.transport.server",
    "nats_endpoint": "sapo_async.fabric.transport.embedded",
    "open_jetstream": "sapo_async.fabric.transport.jetstream",
    "rollouts_subject": "sapo_async.fabric.transport.base",
    "spawn_nats_server": "sapo_async.fabric.transport.server",
    "stream_name": "sapo_async.fabric.transport.jetstream",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "Delivery",
    "EmbeddedNats",
    "JetStreamTransport",
    "MemoryBroker",
    "MemoryTransport",
    "NatsOptions",
    "NatsServer",
    "PublishAck",
    "StartAt",
    "StreamSettings",
    "Subscription",
    "Transport",
    "connect_nats",
    "find_nats_server",
    "nats_endpoint",
    "open_jetstream",
    "rollouts_subject",
    "spawn_nats_server",
    "stream_name",
]
