"""A stream and a durable consumer made before sharding keep working after the upgrade.

JetStream only: the in-memory broker has no stream configuration to migrate (its stream
takes any subject), which the conformance suite's legacy-subject test covers for both.
"""

from __future__ import annotations

import anyio
import pytest
from nats.js import api

from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.base import StartAt
from sapo_async.fabric.transport.embedded import NatsOptions, connect_nats
from sapo_async.fabric.transport.jetstream import JetStreamTransport, stream_name
from sapo_async.fabric.transport.shards import ShardSet
from sapo_async.wire.signing import encode_signed, rollout_hash, sign_group
from tests.fixtures.fabric import SWARM, make_account, make_group

pytestmark = [pytest.mark.anyio, pytest.mark.nats]

FAMILY = "basic_arithmetic"


async def test_legacy_stream_and_durable_consumer_are_upgraded_in_place(nats_server) -> None:  # type: ignore[no-untyped-def]
    # The world before sharding: stream on rollouts.*, one stored group on the family
    # subject, a durable consumer filtered on it that has not read it yet.
    nc = await connect_nats(NatsOptions(url=nats_server.url))
    js = nc.jetstream()
    await js.add_stream(
        api.StreamConfig(name=stream_name(SWARM), subjects=[f"sapo.{SWARM}.rollouts.*"])
    )
    old = make_account(1)
    legacy = sign_group(old, make_group(old, index=0))
    await js.publish(
        f"sapo.{SWARM}.rollouts.{FAMILY}",
        encode_signed(legacy),
        headers={"Nats-Msg-Id": rollout_hash(legacy.body).hex()},
    )
    await js.add_consumer(
        stream_name(SWARM),
        config=api.ConsumerConfig(
            durable_name="node-a",
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subject=f"sapo.{SWARM}.rollouts.{FAMILY}",
            deliver_policy=api.DeliverPolicy.ALL,
        ),
    )

    # The upgrade: the operator widens the stream (nodes never update a stream they find,
    # infra/README.md), then a new node connects and publishes on its leaf.
    widened = (await js.stream_info(stream_name(SWARM))).config
    widened.subjects = [f"sapo.{SWARM}.rollouts.>"]
    await js.update_stream(widened)
    transport = await JetStreamTransport.connect(NatsOptions(url=nats_server.url), SWARM)
    try:
        info = await js.stream_info(stream_name(SWARM))
        assert info.config.subjects == [f"sapo.{SWARM}.rollouts.>"]
        assert info.state.messages == 1  # nothing lost in the update
        new = make_account(2)
        await transport.publish(sign_group(new, make_group(new, index=1)), family=FAMILY)

        # The old durable consumer resumes where it was and now sees both forms.
        sub = await transport.subscribe(families=[FAMILY], durable="node-a")
        got = []
        with anyio.fail_after(10):
            while len(got) < 2:
                for d in await sub.fetch(8, 0.5):
                    got.append(d.subject)
                    await d.ack()
        assert got[0] == f"sapo.{SWARM}.rollouts.{FAMILY}"
        assert got[1].startswith(f"sapo.{SWARM}.rollouts.{FAMILY}.")
        await sub.aclose()
        consumer = await js.consumer_info(stream_name(SWARM), "node-a")
        assert sorted(consumer.config.filter_subjects or []) == [
            f"sapo.{SWARM}.rollouts.{FAMILY}",
            f"sapo.{SWARM}.rollouts.{FAMILY}.>",
        ]
    finally:
        await transport.aclose()
        await nc.close()


async def test_closing_an_ephemeral_shard_consumer_deletes_it(nats_server) -> None:  # type: ignore[no-untyped-def]
    transport = await JetStreamTransport.connect(NatsOptions(url=nats_server.url), SWARM)
    try:
        for i in range(3):  # what a node rotating shards does each epoch
            sub = await transport.subscribe(shards=ShardSet(16, (i,)))
            await sub.aclose()
        names = [c.name for c in await transport.js.consumers_info(stream_name(SWARM))]
        assert names == []
    finally:
        await transport.aclose()


async def test_a_legacy_stream_nobody_widens_still_takes_every_group(nats_server) -> None:  # type: ignore[no-untyped-def]
    # An operator's stream on rollouts.* that volunteers may not update: publishing on
    # leaves would be refused, so the transport publishes on the family subject instead.
    nc = await connect_nats(NatsOptions(url=nats_server.url))
    js = nc.jetstream()
    await js.add_stream(
        api.StreamConfig(name=stream_name(SWARM), subjects=[f"sapo.{SWARM}.rollouts.*"])
    )
    transport = JetStreamTransport(nc, SWARM)
    try:
        await transport._learn_subjects()  # what connect does after ensure_stream
        sub = await transport.subscribe(families=[FAMILY], start=StartAt.everything())
        producer = make_account(3)
        ack = await transport.publish(sign_group(producer, make_group(producer)), family=FAMILY)
        assert not ack.duplicate
        (delivery,) = await sub.fetch(4, 5.0)
        assert delivery.subject == f"sapo.{SWARM}.rollouts.{FAMILY}"
        await delivery.ack()
        await sub.aclose()
    finally:
        await transport.aclose()
        await nc.close()


async def test_on_a_stream_without_leaves_the_collector_accepts_the_family_subject(  # type: ignore[no-untyped-def]
    nats_server,
) -> None:
    # Before the operator widens the stream every group is on its family subject: there
    # is no leaf to check, and every reader reads everything.
    nc = await connect_nats(NatsOptions(url=nats_server.url))
    js = nc.jetstream()
    await js.add_stream(
        api.StreamConfig(name=stream_name(SWARM), subjects=[f"sapo.{SWARM}.rollouts.*"])
    )
    transport = JetStreamTransport(nc, SWARM)
    try:
        await transport._learn_subjects()  # what connect does after ensure_stream
        assert not transport.leaves
        producer = make_account(4)
        async with Collector(transport, start=StartAt.everything(), name="c") as collector:
            await transport.publish(sign_group(producer, make_group(producer)), family=FAMILY)
            await collector.wait_accepted(1, timeout=10)
            stats = collector.statistics()
        assert stats.rejected == {}
        assert [b.producer for b in collector.candidates()] == [producer.address]
    finally:
        await transport.aclose()
        await nc.close()
