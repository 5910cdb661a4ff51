"""The pure part of sharding: leaves, filters, plans, rotation, and the size rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo_async.errors import ConfigError
from sapo_async.fabric.transport.shards import (
    SHARD_COUNTS,
    ShardPlan,
    ShardSet,
    body_producer,
    parse_rollouts_subject,
    producer_leaf,
    shard_filters,
    sharded_subject,
    subject_matches,
)
from sapo_async.wire.rollout import encode_group, keccak256
from tests.fixtures.fabric import make_account, make_group

SW = "sw"
ADDRESSES = [make_account(i).address for i in range(64)]


def test_a_producers_leaf_is_three_hex_digits_fixed_by_family_and_address() -> None:
    a = ADDRESSES[0]
    assert producer_leaf("bf", a) == producer_leaf("bf", a.lower())
    assert re.fullmatch("[0-9a-f]{3}", producer_leaf("bf", a))
    # Fixed by the family too: the leaf is keccak256("<family>:<address>")'s first digits.
    assert producer_leaf("bf", a) == keccak256(f"bf:{a.lower()}".encode()).hex()[:3]
    # Families spread one producer: not all 9 families land on the same leaf.
    assert len({producer_leaf(f"fam{i}", a) for i in range(9)}) > 1
    subject = sharded_subject(SW, "bf", a)
    assert parse_rollouts_subject(SW, subject) == ("bf", producer_leaf("bf", a))
    assert parse_rollouts_subject(SW, "sapo.sw.rollouts.bf") == ("bf", None)
    assert parse_rollouts_subject(SW, "sapo.other.rollouts.bf") is None
    assert parse_rollouts_subject(SW, "sapo.sw.rollouts.bf.x.y.z") is None
    assert parse_rollouts_subject(SW, "sapo.sw.rollouts.bf.a.b") is None


def test_body_producer_reads_the_field_or_says_none() -> None:
    account = make_account(1)
    assert body_producer(encode_group(make_group(account))) == account.address
    assert body_producer(b"\x93\x01\x02\x03") is None
    assert body_producer(b"") is None


@settings(deadline=None, max_examples=25)  # S = 4096 builds 4096 filters per example
@given(st.sampled_from(SHARD_COUNTS[1:]), st.data())
def test_each_leaf_matches_exactly_one_shard_filter(count: int, data: st.DataObject) -> None:
    address = data.draw(st.sampled_from(ADDRESSES))
    subject = sharded_subject(SW, "bf", address)
    hits = [
        i
        for i in range(count)
        if any(
            subject_matches(f, subject) for f in shard_filters(SW, ["bf"], ShardSet(count, (i,)))
        )
    ]
    assert len(hits) == 1
    assert ShardSet(count, (hits[0],)).holds(producer_leaf("bf", address))


def test_filters_per_plan() -> None:
    assert shard_filters(SW, None, ShardSet.everything()) == ["sapo.sw.rollouts.>"]
    assert shard_filters(SW, ["b", "a"], ShardSet.everything()) == [
        "sapo.sw.rollouts.a",
        "sapo.sw.rollouts.a.>",
        "sapo.sw.rollouts.b",
        "sapo.sw.rollouts.b.>",
    ]
    assert shard_filters(SW, None, ShardSet(256, (0x1F, 0xA0))) == [
        "sapo.sw.rollouts.*.1.f.>",
        "sapo.sw.rollouts.*.a.0.>",
    ]
    assert shard_filters(SW, ["x"], ShardSet(4096, (0xABC,))) == ["sapo.sw.rollouts.x.a.b.c"]


def test_subject_matching_follows_nats_wildcards() -> None:
    assert subject_matches("a.*.c", "a.b.c")
    assert not subject_matches("a.*.c", "a.b.c.d")
    assert subject_matches("a.>", "a.b.c")
    assert not subject_matches("a.>", "a")
    assert subject_matches("a.b", "a.b")
    assert not subject_matches("a.b", "a.b.c")


@pytest.mark.parametrize(
    ("count", "read", "rotate", "field"),
    [
        (8, None, 60.0, "fabric.shards"),
        (16, 17, 60.0, "fabric.shards_read"),
        (16, 0, 60.0, "fabric.shards_read"),
        (16, 2, 0.0, "fabric.shard_rotate_s"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_setting(
    count: int, read: int | None, rotate: float, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ShardPlan(count, read, rotate)
    assert info.value.field == field
    assert field in str(info.value)


@settings(deadline=None)
@given(st.sampled_from(SHARD_COUNTS[1:3]), st.integers(1, 256), st.sampled_from(ADDRESSES))
def test_rotation_reads_every_shard_once_in_s_over_k_epochs(
    count: int, read: int, key: str
) -> None:
    plan = ShardPlan(count, min(read, count), rotate_s=60)
    seen: list[int] = []
    for epoch in range(7, 7 + plan.epochs_to_cover):
        chosen = plan.shards_at(key, epoch).indices
        assert len(chosen) == plan.k
        seen += chosen
    assert set(seen) == set(range(count))
    if count % plan.k == 0:
        assert sorted(seen) == list(range(count))  # each exactly once


def test_epochs_turn_every_rotate_s_at_a_phase_of_the_nodes_own() -> None:
    plan = ShardPlan(16, 2, rotate_s=100)
    a, b = ADDRESSES[0], ADDRESSES[1]
    assert plan.epoch(a, 1000.0) + 1 == plan.epoch(a, 1100.0)
    turned = {plan.epoch(x, 50.0) - plan.epoch(x, 0.0) for x in ADDRESSES}
    assert turned == {0, 1}  # some nodes turn in the first half of an epoch, some later
    assert plan.shards_at(a, 3) != plan.shards_at(b, 3) or plan.shards_at(a, 4) != plan.shards_at(
        b, 4
    )


@pytest.mark.parametrize("nodes", [8, 100, 1000, 10_000])
def test_the_size_rule_keeps_expected_ingress_near_c_times_j(nodes: int) -> None:
    g, j, c = 4, 4, 4
    plan = ShardPlan.for_swarm(nodes, g, external=j, factor=c)
    ingress = (nodes - 1) * g * plan.fraction
    if nodes == 8:
        assert plan.count == 1  # 28 groups: reading all is within 2x of 16
    else:
        assert 0.85 * c * j <= ingress <= 1.5 * c * j, (plan, ingress)
    assert plan.count >= (1 if nodes < 100 else 256)


def test_describe_says_what_is_read() -> None:
    assert "whole swarm" in ShardPlan().describe()
    text = ShardPlan(256, 10, 300).describe()
    assert "10 of 256" in text
    assert "26 epochs" in text


@pytest.mark.anyio
async def test_a_rotation_the_servers_refuse_is_retried_at_the_next_fetch() -> None:
    from sapo_async.errors import TransportUnavailable
    from sapo_async.fabric.transport.memory import MemoryBroker
    from sapo_async.fabric.transport.rotating import RotatingSubscription, subscribe_planned

    class Flaky:
        """The memory transport, whose next subscribe fails (a server restarting)."""

        def __init__(self) -> None:
            self.inner = MemoryBroker().connect(SW)
            self.swarm = SW
            self.fail_next = False

        async def subscribe(self, **kwargs):  # type: ignore[no-untyped-def]
            if self.fail_next:
                self.fail_next = False
                raise TransportUnavailable("no meta leader")
            return await self.inner.subscribe(**kwargs)

    transport = Flaky()
    now = [0.0]
    plan = ShardPlan(16, 4, rotate_s=10)
    sub = await subscribe_planned(
        transport,  # type: ignore[arg-type]
        families=None,
        plan=plan,
        key=ADDRESSES[0],
        clock=lambda: now[0],
    )
    assert isinstance(sub, RotatingSubscription)
    first = sub.shards
    now[0] += 10
    transport.fail_next = True
    assert await sub.fetch(4, 0.01) == []  # refused: nothing, no error
    assert (sub.rotations, sub.shards) == (0, first)
    assert await sub.fetch(4, 0.01) == []  # retried: on the next shard set now
    assert sub.rotations == 1
    assert sub.shards == plan.shards_at(ADDRESSES[0], sub.epoch) != first
    await sub.aclose()
    with pytest.raises(TransportUnavailable):
        await sub.fetch(4, 0.01)
