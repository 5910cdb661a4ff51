"""Broker permissions and consumer repair on a real nats-server.

The server runs with the real ``infra/nats/accounts.conf``: the operator (the dev operator
user) creates the swarm's stream; a volunteer credential (the dev volunteer user, with the
same permissions as the example volunteer nkeys) tries to delete, purge and update the
stream, delete messages and consumers, list consumers and publish to another swarm. Every
attempt is refused, the stream keeps its messages and settings, and the volunteer's node
side (JetStream transport, collector) still publishes, consumes and acks.

Consumers bound to their users: each volunteer credential may create, inspect, fetch from
and ack only the consumers named after its owner token (``<owner>-0`` .. ``<owner>-5``); a
second volunteer can neither fetch from, ack on, inspect nor take over the first's consumer,
and a node that names its consumers at random (no ``consumer_owner``) is refused.

Consumer repair: a collector whose consumer is deleted again and again, and whose stream
disappears for a while (so re-creating the consumer is refused), keeps running and admits
every group published afterwards.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from collections.abc import Awaitable, Iterator
from pathlib import Path

import anyio
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from sapo_async.errors import TransportError
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import StartAt
from sapo_async.fabric.transport.embedded import NatsOptions
from sapo_async.fabric.transport.jetstream import JetStreamTransport, StreamSettings
from sapo_async.fabric.transport.server import NatsServer, spawn_nats_server
from sapo_async.process import free_port
from tests.fixtures.fabric import make_account, make_group
from tests.fixtures.volunteer import DEV_PASSWORD, DEV_USER, INFRA

pytestmark = [pytest.mark.anyio, pytest.mark.nats]

SWARM = "main"  # the swarm the example permissions in accounts.conf are written for
STREAM = "SAPO_main"
VOLUNTEER_USER, VOLUNTEER_PASSWORD = "sapo-volunteer", "dev-only-volunteer"  # owner v1
OTHER_USER, OTHER_PASSWORD = "sapo-volunteer2", "dev-only-volunteer2"  # owner v2
GENERATOR = INFRA / "gen_permissions.py"
REFUSED_WITHIN_S = 1.0  # a refused request gets no answer: this is how long we wait for one


@pytest.fixture
def accounts_server(tmp_path: Path) -> Iterator[NatsServer]:
    """One JetStream nats-server with infra/nats/accounts.conf, on a free loopback port."""
    work = tmp_path / "perm"
    work.mkdir()
    shutil.copy(INFRA / "accounts.conf", work / "accounts.conf")
    port = free_port()
    conf = work / "server.conf"
    conf.write_text(
        f"host: 127.0.0.1\nport: {port}\nserver_name: perm\n"
        f'jetstream {{ store_dir: "{work / "js"}", max_file_store: 256MB }}\n'
        "include ./accounts.conf\n"
    )
    server = spawn_nats_server(work, port=port, config_file=conf, name="perm").wait_ready()
    try:
        yield server
    finally:
        server.stop()
    assert not server.process.running


def _url(server: NatsServer, user: str, password: str) -> str:
    return f"nats://{user}:{password}@{server.host}:{server.port}"


async def _operator_creates_stream(server: NatsServer) -> None:
    config = api.StreamConfig.from_response(
        json.loads((INFRA / "stream-rollouts.json").read_text())
    )
    config = dataclasses.replace(config, num_replicas=1, max_bytes=64 * 1024 * 1024)
    nc = await nats.connect(_url(server, DEV_USER, DEV_PASSWORD), connect_timeout=2)
    try:
        await nc.jetstream(timeout=2).add_stream(config)
    finally:
        await nc.close()


async def test_volunteer_cannot_delete_purge_or_update_the_stream_and_the_swarm_is_unharmed(
    accounts_server: NatsServer,
) -> None:
    await _operator_creates_stream(accounts_server)
    operator = await nats.connect(_url(accounts_server, DEV_USER, DEV_PASSWORD))
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    volunteer = await nats.connect(
        _url(accounts_server, VOLUNTEER_USER, VOLUNTEER_PASSWORD), error_cb=on_error
    )
    try:
        ojs = operator.jetstream(timeout=2)
        for i in range(5):
            await ojs.publish(f"sapo.{SWARM}.rollouts.fam", f"m{i}".encode())
        before = await ojs.stream_info(STREAM)
        consumer = await ojs.add_consumer(
            STREAM, config=api.ConsumerConfig(durable_name="operator-c")
        )

        vjs = volunteer.jetstream(timeout=REFUSED_WITHIN_S)
        shrunk = dataclasses.replace(before.config, max_age=1.0, max_msgs=1)
        attacks = {
            "STREAM.DELETE": vjs.delete_stream(STREAM),
            "STREAM.PURGE": vjs.purge_stream(STREAM),
            "STREAM.UPDATE": vjs.update_stream(shrunk),
            "STREAM.MSG.DELETE": vjs.delete_msg(STREAM, 1),
            "CONSUMER.DELETE": vjs.delete_consumer(STREAM, consumer.name or ""),
            "CONSUMER.LIST": vjs.consumers_info(STREAM),
            "STREAM.CREATE": vjs.add_stream(name="SAPO_evil", subjects=["evil.>"]),
        }
        for api_name, attempt in attacks.items():
            # The server drops a refused request (no answer) and reports the violation.
            with pytest.raises(nats.errors.TimeoutError):
                await attempt
            with anyio.fail_after(5):
                # nats-py reports the subject lower-cased
                while not any(f"$js.api.{api_name.lower()}." in v for v in violations):
                    await anyio.sleep(0.05)
        # Another swarm's subjects are out of reach too.
        await volunteer.publish("sapo.other.rollouts.fam", b"x")
        await volunteer.flush()
        with anyio.fail_after(5):
            while not any('publish to "sapo.other.rollouts.fam"' in v for v in violations):
                await anyio.sleep(0.05)

        # The stream is unharmed: same messages, same settings, the operator's consumer kept.
        after = await ojs.stream_info(STREAM)
        assert after.state.messages == before.state.messages == 5
        assert after.config.max_age == before.config.max_age
        assert after.config.max_msgs == before.config.max_msgs
        assert (await ojs.consumer_info(STREAM, "operator-c")).name == "operator-c"
        assert [s.config.name for s in await ojs.streams_info()] == [STREAM]
    finally:
        await volunteer.close()
        await operator.close()

    # And the volunteer's node still works with its credential: connect (the stream exists,
    # so it is used as it is), publish, subscribe, fetch, ack.
    producer = make_account(1)
    options = NatsOptions(
        url=_url(accounts_server, VOLUNTEER_USER, VOLUNTEER_PASSWORD), consumer_owner="v1"
    )
    transport = await JetStreamTransport.connect(options, SWARM, settings=StreamSettings())
    try:
        sub = await transport.subscribe()
        receipt = await Publisher(transport, producer).publish(make_group(producer, swarm=SWARM))
        with anyio.fail_after(10):
            got = []
            while not got:
                got = await sub.fetch(8, 0.2)
        assert got[0].msg_id == receipt.rollout_hash.hex()
        await got[0].ack()
        await sub.aclose()
    finally:
        await transport.aclose()


@pytest.mark.timeout(120)
async def test_collector_survives_its_consumer_being_deleted_repeatedly(
    accounts_server: NatsServer,
) -> None:
    await _operator_creates_stream(accounts_server)
    producer = make_account(1)
    volunteer = NatsOptions(
        url=_url(accounts_server, VOLUNTEER_USER, VOLUNTEER_PASSWORD), consumer_owner="v1"
    )
    operator = await nats.connect(_url(accounts_server, DEV_USER, DEV_PASSWORD))
    ojs = operator.jetstream(timeout=2)
    pub_transport = await JetStreamTransport.connect(volunteer, SWARM)
    sub_transport = await JetStreamTransport.connect(volunteer, SWARM)
    published: list[bytes] = []
    index = 0

    async def publish(n: int) -> None:
        nonlocal index
        publisher = Publisher(pub_transport, producer, retries=20, retry_base_s=0.1)
        for _ in range(n):
            receipt = await publisher.publish(make_group(producer, swarm=SWARM, index=index))
            published.append(receipt.rollout_hash)
            index += 1

    try:
        async with Collector(
            sub_transport,
            own_address=make_account(0).address,
            fetch_max_wait=0.2,
            max_round_lag=1_000_000,
        ) as collector:
            sub = collector._sub  # the repair counters are what this test checks
            assert sub is not None
            await publish(2)
            await collector.wait_accepted(len(published), timeout=20)
            for k in range(5):  # the operator (or a failing server) deletes it, five times
                await ojs.delete_consumer(STREAM, sub.name)
                await publish(2)
                await collector.wait_accepted(len(published), timeout=30)
                assert sub.repairs >= k + 1
            # The stream goes away for a while: re-creating the consumer is refused, again
            # and again, and the collector (and the node) keeps running through it.
            await ojs.delete_stream(STREAM)
            with anyio.fail_after(30):  # until two refusals, or the collector gave up
                while collector.state.value == "running" and sub.repair_failures < 2:
                    await anyio.sleep(0.05)
            assert collector.state.value == "running"
            await _operator_creates_stream(accounts_server)
            await publish(3)
            await collector.wait_accepted(len(published), timeout=60)
            assert {b.rollout_hash for b in collector.candidates()} == set(published)
            assert collector.state.value == "running"
    finally:
        await pub_transport.aclose()
        await sub_transport.aclose()
        await operator.close()


def test_committed_volunteer_blocks_are_what_the_generator_prints() -> None:
    spec = importlib.util.spec_from_file_location("gen_permissions", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    conf = (INFRA / "accounts.conf").read_text()
    for owner in ("leaf", "node", "v1", "v2"):
        assert gen.permissions_block(SWARM, owner) in conf


@pytest.mark.timeout(120)
async def test_a_volunteer_cannot_fetch_from_ack_inspect_or_take_over_anothers_consumer(
    accounts_server: NatsServer,
) -> None:
    await _operator_creates_stream(accounts_server)
    producer = make_account(1)
    mine = NatsOptions(
        url=_url(accounts_server, VOLUNTEER_USER, VOLUNTEER_PASSWORD), consumer_owner="v1"
    )
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    async def refused(api_name: str, attempt: Awaitable[object]) -> None:
        # The server drops a refused request (no answer) and reports the violation.
        with pytest.raises(nats.errors.TimeoutError):
            await attempt
        with anyio.fail_after(5):
            while not any(api_name.lower() in v for v in violations):
                await anyio.sleep(0.05)

    transport = await JetStreamTransport.connect(mine, SWARM)
    other = await nats.connect(_url(accounts_server, OTHER_USER, OTHER_PASSWORD), error_cb=on_error)
    try:
        sub = await transport.subscribe()
        assert sub.name == "v1-0"
        receipt = await Publisher(transport, producer).publish(make_group(producer, swarm=SWARM))
        ojs = other.jetstream(timeout=REFUSED_WITHIN_S)
        await refused(
            f"$js.api.consumer.msg.next.{STREAM}.v1-0",
            other.request(
                f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.v1-0",
                b'{"batch": 1}',
                timeout=REFUSED_WITHIN_S,
            ),
        )
        await refused(f"$js.api.consumer.info.{STREAM}.v1-0", ojs.consumer_info(STREAM, "v1-0"))
        await refused(
            f"$js.api.consumer.create.{STREAM}.v1-0",
            ojs.add_consumer(STREAM, config=api.ConsumerConfig(name="v1-0")),
        )
        # An ack is a plain publish to the delivery's reply subject: refused and reported.
        await other.publish(f"$JS.ACK.{STREAM}.v1-0.1.1.1.1.0", b"+ACK")
        await other.flush()
        with anyio.fail_after(5):
            while not any(f"$js.ack.{STREAM.lower()}.v1-0" in v for v in violations):
                await anyio.sleep(0.05)
        # The owner still fetches and acks its group; the other volunteer's own consumer works.
        with anyio.fail_after(10):
            got = []
            while not got:
                got = await sub.fetch(8, 0.2)
        assert got[0].msg_id == receipt.rollout_hash.hex()
        await got[0].ack()
        theirs = NatsOptions(
            url=_url(accounts_server, OTHER_USER, OTHER_PASSWORD), consumer_owner="v2"
        )
        other_transport = await JetStreamTransport.connect(theirs, SWARM)
        try:
            assert (await other_transport.subscribe(start=StartAt.new())).name == "v2-0"
        finally:
            await other_transport.aclose()
        await sub.aclose()
    finally:
        await other.close()
        await transport.aclose()


async def test_a_node_without_its_consumer_owner_cannot_create_a_consumer(
    accounts_server: NatsServer,
) -> None:
    await _operator_creates_stream(accounts_server)
    anonymous = NatsOptions(url=_url(accounts_server, VOLUNTEER_USER, VOLUNTEER_PASSWORD))
    transport = await JetStreamTransport.connect(anonymous, SWARM)
    try:
        with pytest.raises(TransportError):  # a random name is not one of its owned names
            await transport.subscribe()
    finally:
        await transport.aclose()
