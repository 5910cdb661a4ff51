"""Fault: nats-server restarts (same store) in the middle of a stream of publishes."""

from __future__ import annotations

import anyio
import pytest

from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.embedded import EmbeddedNats, NatsOptions, live_embedded_servers
from sapo_async.fabric.transport.jetstream import JetStreamTransport, open_jetstream
from tests.fixtures.fabric import SWARM, make_account, make_group

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("durable", [None, "node-b"])
async def test_no_acknowledged_group_is_lost_or_admitted_twice_across_a_server_restart(
    nats_server: EmbeddedNats, durable: str | None
) -> None:
    producer = make_account(1)
    total, restart_after = 40, 15
    options = NatsOptions(url=nats_server.url)
    pub_transport = await JetStreamTransport.connect(options, SWARM)
    sub_transport = await JetStreamTransport.connect(options, SWARM)
    acked: list[bytes] = []
    try:
        async with Collector(
            sub_transport,
            own_address=make_account(0).address,
            durable=durable,
            fetch_max_wait=0.2,
            # Publishing goes on until the restart is done, so on a loaded machine the
            # producer's round can run past the default lag and evict round 0 for staleness:
            # this test is about loss and duplicates only.
            max_round_lag=1_000_000,
        ) as collector:
            publisher = Publisher(pub_transport, producer, retries=8, retry_base_s=0.1)
            async with anyio.create_task_group() as tg:
                restarted = anyio.Event()

                async def restart_when_due() -> None:
                    with anyio.fail_after(30):
                        while len(acked) < restart_after:
                            await anyio.sleep(0.01)
                    await nats_server.restart()
                    restarted.set()

                tg.start_soon(restart_when_due)
                # Keep publishing through the restart, and a few groups after it.
                i = 0
                while i < total or not restarted.is_set():
                    receipt = await publisher.publish(
                        make_group(producer, index=i, producer_round=i // 8)
                    )
                    acked.append(receipt.rollout_hash)
                    i += 1
                for _ in range(5):
                    receipt = await publisher.publish(
                        make_group(producer, index=i, producer_round=i // 8)
                    )
                    acked.append(receipt.rollout_hash)
                    i += 1
                total = i

            await collector.wait_accepted(total, timeout=60)
            # Give redeliveries (lost acks) a chance to show up as duplicates, not admissions.
            with pytest.raises(TimeoutError):
                await collector.wait_accepted(total + 1, timeout=1.0)
            stats = collector.statistics()
            assert stats.accepted == total
            assert {b.rollout_hash for b in collector.candidates()} == set(acked)
            assert set(stats.rejected) <= {"duplicate"}
            assert len(set(acked)) == total
    finally:
        await pub_transport.aclose()
        await sub_transport.aclose()


@pytest.mark.timeout(60)
async def test_subscription_recreates_its_consumer_when_the_server_lost_it(
    nats_server: EmbeddedNats,
) -> None:
    producer = make_account(1)
    options = NatsOptions(url=nats_server.url)
    transport = await JetStreamTransport.connect(options, SWARM)
    try:
        publisher = Publisher(transport, producer)
        sub = await transport.subscribe()
        for i in range(3):
            await publisher.publish(make_group(producer, index=i))
        seen: list[int] = []
        with anyio.fail_after(10):
            while len(seen) < 3:
                for d in await sub.fetch(8, 0.2):
                    seen.append(d.seq)
                    await d.ack()
        # The server forgets the consumer (as after losing an ephemeral consumer's state).
        await transport.js.delete_consumer(transport.stream, sub.name)
        for i in range(3, 6):
            await publisher.publish(make_group(producer, index=i))
        with anyio.fail_after(20):
            while len(seen) < 6:
                for d in await sub.fetch(8, 0.2):
                    seen.append(d.seq)
                    await d.ack()
        assert seen == sorted(set(seen))
        assert sub.repairs >= 1
        await sub.aclose()
    finally:
        await transport.aclose()


async def test_open_jetstream_without_url_runs_a_private_server_and_stops_it(
    no_leaks: None,
) -> None:
    producer = make_account(1)
    async with open_jetstream(SWARM) as transport:
        receipt = await Publisher(transport, producer).publish(make_group(producer))
        assert receipt.ack.stream == transport.stream
        assert len(live_embedded_servers()) == 1
    assert live_embedded_servers() == []
