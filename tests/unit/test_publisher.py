"""Publisher: retries what was not acknowledged, never what was refused."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sapo_async.errors import PublishError, PublishRefused
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import PublishAck, StartAt
from sapo_async.fabric.transport.memory import MemoryBroker, MemorySubscription, MemoryTransport
from sapo_async.wire.rollout import SignedGroup
from sapo_async.wire.signing import decode_signed, verify
from tests.fixtures.fabric import SWARM, make_account, make_group

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_leaks")]
PRODUCER = make_account(1)


class FlakyTransport:
    """Test seam: fails the first ``failures`` publishes with ``error``, then delegates."""

    def __init__(self, inner: MemoryTransport, failures: int, error: Exception) -> None:
        self.inner = inner
        self.failures = failures
        self.error = error
        self.calls = 0
        self.passed: tuple[str | None, bytes | None] = (None, None)

    @property
    def swarm(self) -> str:
        return self.inner.swarm

    @property
    def leaves(self) -> bool:
        return self.inner.leaves

    async def publish(
        self,
        signed: SignedGroup,
        *,
        family: str,
        producer: str | None = None,
        rollout_hash: bytes | None = None,
    ) -> PublishAck:
        self.calls += 1
        self.passed = (producer, rollout_hash)
        if self.calls <= self.failures:
            raise self.error
        return await self.inner.publish(
            signed, family=family, producer=producer, rollout_hash=rollout_hash
        )

    async def subscribe(
        self,
        *,
        families: Sequence[str] | None = None,
        start: StartAt | None = None,
        durable: str | None = None,
    ) -> MemorySubscription:
        return await self.inner.subscribe(families=families, start=start, durable=durable)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_publish_signs_with_the_producer_key_and_returns_the_ack() -> None:
    transport = MemoryBroker().connect(SWARM)
    sub = await transport.subscribe()
    receipt = await Publisher(transport, PRODUCER).publish(make_group(PRODUCER))
    (delivery,) = await sub.fetch(4, 1.0)
    _, digest, signer = verify(decode_signed(delivery.data))
    assert signer == PRODUCER.address
    assert digest == receipt.rollout_hash
    assert receipt.attempts == 1


async def test_unacknowledged_publish_is_retried_until_acknowledged() -> None:
    flaky = FlakyTransport(MemoryBroker().connect(SWARM), 2, PublishError("no ack"))
    publisher = Publisher(flaky, PRODUCER, retries=5, retry_base_s=0.001)
    receipt = await publisher.publish(make_group(PRODUCER))
    assert receipt.attempts == 3
    assert publisher.statistics().retries == 2


async def test_publish_gives_up_after_its_retries() -> None:
    flaky = FlakyTransport(MemoryBroker().connect(SWARM), 10, PublishError("no ack"))
    publisher = Publisher(flaky, PRODUCER, retries=3, retry_base_s=0.001)
    with pytest.raises(PublishError):
        await publisher.publish(make_group(PRODUCER))
    assert flaky.calls == 3
    assert publisher.statistics().failed == 1


async def test_refused_publish_is_not_retried() -> None:
    flaky = FlakyTransport(MemoryBroker().connect(SWARM), 10, PublishRefused("too big"))
    publisher = Publisher(flaky, PRODUCER, retries=5, retry_base_s=0.001)
    with pytest.raises(PublishRefused):
        await publisher.publish(make_group(PRODUCER))
    assert flaky.calls == 1


async def test_publishing_another_producers_group_is_refused_before_signing() -> None:
    publisher = Publisher(MemoryBroker().connect(SWARM), PRODUCER)
    with pytest.raises(ValueError, match="producer"):
        await publisher.publish(make_group(make_account(2)))


async def test_the_publisher_hands_the_transport_the_hash_and_producer_it_already_has() -> None:
    transport = FlakyTransport(MemoryBroker().connect(SWARM), 0, PublishError("unused"))
    receipt = await Publisher(transport, PRODUCER).publish(make_group(PRODUCER))
    assert transport.passed == (PRODUCER.address, receipt.rollout_hash)
