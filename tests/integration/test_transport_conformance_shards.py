"""The transport conformance suite, sharding part: run against memory and real JetStream.

Producers publish on their leaf; a reader of k of S shards gets exactly the groups of the
producers in them; rotating readers cover every producer; whole-swarm readers still read
the legacy unsharded subjects; the collector refuses a group on someone else's leaf.
"""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from sapo_async.errors import ConfigError
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.base import StartAt, Subscription, rollouts_subject
from sapo_async.fabric.transport.rotating import RotatingSubscription, subscribe_planned
from sapo_async.fabric.transport.shards import (
    ShardPlan,
    ShardSet,
    producer_leaf,
    sharded_subject,
)
from sapo_async.wire.signing import decode_signed, encode_signed, rollout_hash, sign_group
from tests.fixtures.fabric import SWARM, TransportFactory, make_account, make_group, publish_raw

pytestmark = pytest.mark.anyio

FAMILY = "basic_arithmetic"
PRODUCERS = 48  # with 16 shards, every shard is hit with overwhelming odds (checked below)


async def _drain(sub: Subscription, expected: int) -> list[bytes]:
    """Fetch until ``expected`` messages came, then prove nothing else is there."""
    got: list[bytes] = []
    with anyio.fail_after(15):
        while len(got) < expected:
            for d in await sub.fetch(64, 0.5):
                got.append(d.data)
                await d.ack()
    extra = await sub.fetch(64, 0.3)
    assert extra == [], f"{len(extra)} unexpected extra messages"
    return got


def _producer(data: bytes) -> str:
    from sapo_async.wire.rollout import decode_group

    return decode_group(decode_signed(data).body).producer


async def _publish_round(transport, accounts, *, index: int = 0) -> None:  # type: ignore[no-untyped-def]
    for account in accounts:
        group = make_group(account, family=FAMILY, index=index)
        await transport.publish(sign_group(account, group), family=FAMILY)


async def test_a_reader_of_k_shards_gets_exactly_the_groups_of_producers_on_them(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    accounts = [make_account(100 + i) for i in range(PRODUCERS)]
    leaves = {a.address: producer_leaf(FAMILY, a.address) for a in accounts}
    assert len({leaf[0] for leaf in leaves.values()}) >= 12  # the hash spreads producers
    chosen = ShardSet(16, (2, 7, 11))
    part = await transport.subscribe(families=[FAMILY], start=StartAt.new(), shards=chosen)
    fine = ShardSet(256, tuple(sorted({int(leaves[accounts[0].address][:2], 16)})))
    narrow = await transport.subscribe(start=StartAt.new(), shards=fine)
    everything = await transport.subscribe(start=StartAt.new())
    await _publish_round(transport, accounts)

    want = {a for a, leaf in leaves.items() if int(leaf[0], 16) in chosen.indices}
    got = [_producer(d) for d in await _drain(part, len(want))]
    assert sorted(got) == sorted(want)  # each once, nobody else's
    want_fine = {a for a, leaf in leaves.items() if leaf[:2] == leaves[accounts[0].address][:2]}
    assert {_producer(d) for d in await _drain(narrow, len(want_fine))} == want_fine
    assert len(await _drain(everything, PRODUCERS)) == PRODUCERS
    for sub in (part, narrow, everything):
        await sub.aclose()


async def test_the_sixteen_shards_partition_the_swarm(transport_factory: TransportFactory) -> None:
    transport = await transport_factory()
    accounts = [make_account(200 + i) for i in range(PRODUCERS)]
    subs = [
        await transport.subscribe(start=StartAt.new(), shards=ShardSet(16, (i,))) for i in range(16)
    ]
    await _publish_round(transport, accounts)
    seen: Counter[str] = Counter()
    for i, sub in enumerate(subs):
        expect = sum(1 for a in accounts if producer_leaf(FAMILY, a.address)[0] == f"{i:x}")
        for data in await _drain(sub, expect):
            seen[_producer(data)] += 1
        await sub.aclose()
    assert seen == Counter({a.address: 1 for a in accounts})


async def test_rotating_reader_covers_every_producer_in_s_over_k_epochs(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    accounts = [make_account(300 + i) for i in range(PRODUCERS)]
    now = [1_000_000.0]
    plan = ShardPlan(16, 4, rotate_s=60.0)
    sub = await subscribe_planned(
        transport,
        families=[FAMILY],
        plan=plan,
        key=accounts[0].address,
        start=StartAt.new(),
        clock=lambda: now[0],
    )
    assert isinstance(sub, RotatingSubscription)
    covered: set[str] = set()
    sets: list[tuple[int, ...]] = []
    for epoch in range(plan.epochs_to_cover):
        if epoch:
            now[0] += plan.rotate_s
            await sub.fetch(1, 0.05)  # the first fetch of an epoch moves the consumer
        sets.append(sub.shards.indices)
        await _publish_round(transport, accounts, index=epoch)
        want = {a.address for a in accounts if sub.shards.holds(producer_leaf(FAMILY, a.address))}
        got = {_producer(d) for d in await _drain(sub, len(want))}
        assert got == want  # this epoch's shards only
        covered |= got
    assert sub.rotations == plan.epochs_to_cover - 1
    assert sorted(i for s in sets for i in s) == list(range(16))  # disjoint, complete
    assert covered == {a.address for a in accounts}
    await sub.aclose()


async def test_a_durable_consumer_cannot_rotate(transport_factory: TransportFactory) -> None:
    transport = await transport_factory()
    with pytest.raises(ConfigError, match="cannot rotate"):
        await subscribe_planned(
            transport, families=None, plan=ShardPlan(16, 2), key="k", durable="node-a"
        )


async def test_whole_swarm_readers_read_legacy_subjects_and_shard_readers_do_not(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    old = make_account(400)  # a node from before sharding: it publishes on rollouts.<family>
    signed = sign_group(old, make_group(old))
    everything = await transport.subscribe(families=[FAMILY], start=StartAt.new())
    leaf = int(producer_leaf(FAMILY, old.address)[0], 16)
    shard = await transport.subscribe(start=StartAt.new(), shards=ShardSet(16, (leaf,)))
    await publish_raw(
        transport,
        encode_signed(signed),
        msg_id=rollout_hash(signed.body).hex(),
        subject=rollouts_subject(SWARM, FAMILY),
    )
    assert len(await _drain(everything, 1)) == 1
    assert await shard.fetch(8, 0.3) == []
    await everything.aclose()
    await shard.aclose()


async def test_collector_rejects_a_group_published_on_another_producers_leaf(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    sprayer, honest = make_account(500), make_account(501)
    signed = sign_group(sprayer, make_group(sprayer))
    other_leaf = sharded_subject(
        SWARM,
        FAMILY,
        next(
            make_account(600 + i).address
            for i in range(64)
            if producer_leaf(FAMILY, make_account(600 + i).address)
            != producer_leaf(FAMILY, sprayer.address)
        ),
    )
    async with Collector(transport, start=StartAt.new(), name="c") as collector:
        await publish_raw(
            transport,
            encode_signed(signed),
            msg_id=rollout_hash(signed.body).hex(),
            subject=other_leaf,
        )
        good = sign_group(honest, make_group(honest, index=1))
        await transport.publish(good, family=FAMILY)
        await collector.wait_accepted(1, timeout=10)
        with anyio.fail_after(10):
            while collector.statistics().received < 2:
                await anyio.sleep(0.02)
        stats = collector.statistics()
    assert stats.rejected == {"wrong_shard": 1}
    assert stats.accepted == 1


async def test_collector_rejects_a_group_published_on_the_legacy_subject_as_wrong_shard(
    transport_factory: TransportFactory,
) -> None:
    # The stream takes leaves, so every producer's groups go on its leaf; the legacy family
    # subject (which whole-swarm readers still read, to count old nodes) is nobody's leaf.
    # Without this a producer could skip the shard rule by publishing there.
    transport = await transport_factory()
    sprayer, honest = make_account(700), make_account(701)
    signed = sign_group(sprayer, make_group(sprayer))
    async with Collector(transport, start=StartAt.new(), name="c") as collector:
        await publish_raw(
            transport,
            encode_signed(signed),
            msg_id=rollout_hash(signed.body).hex(),
            subject=rollouts_subject(SWARM, FAMILY),
        )
        await transport.publish(sign_group(honest, make_group(honest, index=1)), family=FAMILY)
        await collector.wait_accepted(1, timeout=10)
        with anyio.fail_after(10):
            while collector.statistics().received < 2:
                await anyio.sleep(0.02)
        stats = collector.statistics()
    assert stats.rejected == {"wrong_shard": 1}
    assert stats.accepted == 1
    assert [b.producer for b in collector.candidates()] == [honest.address]
