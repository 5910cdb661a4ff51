"""One conformance suite for every transport backend (in-memory and real JetStream)."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from sapo_async.errors import ConfigError, PublishRefused, TransportError
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import (
    StartAt,
    Subscription,
)
from sapo_async.fabric.transport.shards import sharded_subject
from sapo_async.wire.rollout import encode_group
from sapo_async.wire.signing import (
    decode_signed,
    encode_signed,
    rollout_hash,
    sign_body,
    sign_group,
)
from tests.fixtures.fabric import (
    SWARM,
    TransportFactory,
    make_account,
    make_group,
    publish_raw,
)

pytestmark = pytest.mark.anyio


async def _drain(sub: Subscription, expected: int, *, ack: bool = True) -> list[bytes]:
    """Fetch until ``expected`` messages came (or 10 s passed), then one more short fetch
    to prove nothing else is there."""
    got: list[bytes] = []
    with anyio.fail_after(10):
        while len(got) < expected:
            for d in await sub.fetch(16, 0.5):
                got.append(d.data)
                if ack:
                    await d.ack()
    extra = await sub.fetch(16, 0.3)
    assert extra == [], f"{len(extra)} unexpected extra messages"
    return got


async def test_published_group_arrives_with_its_hash_as_message_id(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account = make_account(1)
    signed = sign_group(account, make_group(account))
    ack = await transport.publish(signed, family="basic_arithmetic")
    assert ack.seq >= 1
    assert not ack.duplicate
    sub = await transport.subscribe(start=StartAt.everything())
    (delivery,) = await sub.fetch(4, 2.0)
    assert delivery.msg_id == rollout_hash(signed.body).hex()
    assert delivery.subject == sharded_subject(SWARM, "basic_arithmetic", account.address)
    assert delivery.seq == ack.seq
    await delivery.ack()
    await sub.aclose()


async def test_the_hash_and_producer_a_publisher_passes_are_used_as_given_not_derived_again(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account, other = make_account(1), make_account(2)
    signed = sign_group(account, make_group(account))
    # Values the body does not hold: only a transport that uses what it is given (and
    # neither hashes nor decodes the body again) routes and names the message by them.
    given_hash = bytes(32 * [0x11])
    await transport.publish(
        signed, family="basic_arithmetic", producer=other.address, rollout_hash=given_hash
    )
    sub = await transport.subscribe(start=StartAt.everything())
    (delivery,) = await sub.fetch(4, 2.0)
    assert delivery.msg_id == given_hash.hex()
    assert delivery.subject == sharded_subject(SWARM, "basic_arithmetic", other.address)
    await delivery.ack()
    await sub.aclose()


async def test_republishing_the_same_group_is_stored_once(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account = make_account(1)
    signed = sign_group(account, make_group(account))
    first = await transport.publish(signed, family="basic_arithmetic")
    second = await transport.publish(signed, family="basic_arithmetic")
    assert second.duplicate
    assert second.seq == first.seq
    sub = await transport.subscribe(start=StartAt.everything())
    assert len(await _drain(sub, 1)) == 1
    await sub.aclose()


async def test_new_only_consumer_skips_history_and_lookback_consumer_sees_it(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account = make_account(1)
    old = sign_group(account, make_group(account, index=1))
    await transport.publish(old, family="basic_arithmetic")
    fresh_only = await transport.subscribe(start=StartAt.new())
    lookback = await transport.subscribe(start=StartAt.last(60))
    new = sign_group(account, make_group(account, index=2))
    await transport.publish(new, family="basic_arithmetic")
    assert await _drain(fresh_only, 1) == [encode_signed(new)]
    assert len(await _drain(lookback, 2)) == 2
    await fresh_only.aclose()
    await lookback.aclose()


async def test_consumer_filtered_by_family_sees_only_that_family(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account = make_account(1)
    sub = await transport.subscribe(families=["bf"], start=StartAt.new())
    for i, family in enumerate(["bf", "arc_1d", "bf", "basic_arithmetic"]):
        signed = sign_group(account, make_group(account, family=family, index=i))
        await transport.publish(signed, family=family)
    assert len(await _drain(sub, 2)) == 2
    await sub.aclose()


async def test_durable_consumer_resumes_at_its_first_unacked_message(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account = make_account(1)
    sub = await transport.subscribe(start=StartAt.new(), durable="node-a")
    for i in range(4):
        signed = sign_group(account, make_group(account, index=i))
        await transport.publish(signed, family="basic_arithmetic")
    with anyio.fail_after(10):
        batch = []
        while len(batch) < 4:
            batch += await sub.fetch(4, 0.5)
    for delivery in batch[:2]:
        await delivery.ack()
    await sub.aclose()
    resumed = await transport.subscribe(start=StartAt.new(), durable="node-a")
    with anyio.fail_after(15):
        again = []
        while len(again) < 2:
            again += await resumed.fetch(4, 0.5)
    assert sorted(d.seq for d in again) == sorted(d.seq for d in batch[2:])
    for delivery in again:
        await delivery.ack()
    await resumed.aclose()


async def test_oversize_message_is_refused_for_good(transport_factory: TransportFactory) -> None:
    transport = await transport_factory()
    account = make_account(1)
    huge = sign_group(account, make_group(account, pad_to=400 * 1024))
    with pytest.raises(PublishRefused):
        await transport.publish(huge, family="basic_arithmetic")


async def test_family_that_is_not_a_subject_token_is_a_config_error(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    account = make_account(1)
    signed = sign_group(account, make_group(account))
    with pytest.raises(ConfigError, match="family"):
        await transport.publish(signed, family="a.b")


@pytest.mark.parametrize("include_own", [False, True])
async def test_three_producers_three_consumers_each_get_others_groups_exactly_once(
    transport_factory: TransportFactory, include_own: bool
) -> None:
    accounts = [make_account(i) for i in range(3)]
    per_producer = 5
    async with anyio.create_task_group() as tg:
        collectors = []
        for account in accounts:
            collector = Collector(
                await transport_factory(),
                own_address=account.address,
                include_own=include_own,
                fetch_max_wait=0.2,
                name=f"collector-{account.address[:8]}",
            )
            await tg.start(collector.run)
            collectors.append(collector)
        publishers = [Publisher(await transport_factory(), a) for a in accounts]
        sent: dict[str, set[bytes]] = {a.address: set() for a in accounts}
        first = {}
        for i in range(per_producer):
            for account, publisher in zip(accounts, publishers, strict=True):
                family = ["bf", "arc_1d", "basic_arithmetic"][i % 3]
                group = make_group(account, index=i, family=family, producer_round=i)
                first.setdefault(account.address, group)
                receipt = await publisher.publish(group)
                sent[account.address].add(receipt.rollout_hash)
        # Everyone re-publishes one group (a retry): the transport must de-duplicate it.
        for account, publisher in zip(accounts, publishers, strict=True):
            receipt = await publisher.publish(first[account.address])
            assert receipt.ack.duplicate

        expected_each = per_producer * (3 if include_own else 2)
        for collector in collectors:
            await collector.wait_accepted(expected_each, timeout=20)
        for account, collector in zip(accounts, collectors, strict=True):
            # One more fetch cycle must not add anything.
            with pytest.raises(TimeoutError):
                await collector.wait_accepted(expected_each + 1, timeout=0.5)
            stats = collector.statistics()
            assert stats.accepted == expected_each
            assert stats.rejected == {}
            assert stats.skipped_own == (0 if include_own else per_producer)
            got = {b.rollout_hash for b in collector.candidates()}
            want = set().union(
                *(
                    hashes
                    for producer, hashes in sent.items()
                    if include_own or producer != account.address
                )
            )
            assert got == want
            assert not any(
                b.producer == account.address
                for b in collector.candidates(exclude_producers=[account.address])
            )
        for collector in collectors:
            await collector.stop()


async def test_collector_survives_hostile_traffic_and_keeps_admitting_valid_groups(
    transport_factory: TransportFactory,
) -> None:
    peer, mallory = make_account(1), make_account(2)
    good = sign_group(peer, make_group(peer, index=0))
    hostile = [
        (b"", "malformed_envelope"),
        (b"\xc1\xc1\xc1", "malformed_envelope"),
        (encode_signed(good)[:-7], "malformed_envelope"),
        (encode_signed(sign_group(peer, make_group(peer, swarm="evil"))), "wrong_swarm"),
        (
            encode_signed(sign_body(mallory, encode_group(make_group(peer, index=1)))),
            "signer_mismatch",
        ),
        (encode_signed(good), "duplicate"),  # a replay under a fresh message id
    ]
    transport = await transport_factory()
    async with Collector(
        await transport_factory(), own_address=make_account(0).address, fetch_max_wait=0.2
    ) as collector:
        await transport.publish(good, family="basic_arithmetic")
        await collector.wait_accepted(1, timeout=10)
        for n, (data, reason) in enumerate(hostile):
            # Decodable forgeries carry their true hash as message id, so each reaches the
            # check it targets; the replay needs a fresh id to get past the server's dedup.
            msg_id = f"hostile-{n}"
            if reason in {"wrong_swarm", "signer_mismatch"}:
                msg_id = rollout_hash(decode_signed(data).body).hex()
            await publish_raw(transport, data, msg_id=msg_id)
        await transport.publish(
            sign_group(peer, make_group(peer, index=2)), family="basic_arithmetic"
        )
        await collector.wait_accepted(2, timeout=10)
        with anyio.fail_after(10):
            while collector.statistics().received < 2 + len(hostile):
                await anyio.sleep(0.01)
        stats = collector.statistics()
    # The replay's message id is not its hash: the cheaper check names it first.
    want = Counter(reason for _, reason in hostile[:-1]) + Counter({"hash_mismatch": 1})
    assert stats.rejected == dict(want)
    assert stats.accepted == 2


async def test_resuming_a_durable_consumer_with_other_families_is_refused(
    transport_factory: TransportFactory,
) -> None:
    transport = await transport_factory()
    sub = await transport.subscribe(families=["bf"], durable="node-a")
    await sub.aclose()
    with pytest.raises(TransportError, match="node-a"):
        await transport.subscribe(families=["arc_1d"], durable="node-a")
