"""A collector started while JetStream is unreachable retries instead of failing its node.

Seen in the short chaos run (CI): a node restarted while a NATS server of the cluster was
down failed at start with ``TransportUnavailable('cannot reach JetStream: TimeoutError()')``
from its collector's first subscription, and the node exited 1.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sapo_async.backoff import Backoff
from sapo_async.errors import TransportUnavailable
from sapo_async.fabric import collector as collector_module
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.wire.signing import sign_group
from tests.fixtures.fabric import SWARM, make_account, make_group

pytestmark = pytest.mark.anyio


class Flaky:
    """A transport whose first ``failures`` subscriptions find JetStream unreachable."""

    def __init__(self, inner: Any, failures: int) -> None:
        self._inner = inner
        self.failures = failures
        self.calls = 0

    async def subscribe(self, **kw: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransportUnavailable("cannot reach JetStream: TimeoutError()")
        return await self._inner.subscribe(**kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_collector_started_while_jetstream_is_unreachable_comes_up_when_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = MemoryBroker()
    flaky = Flaky(broker.connect(SWARM), failures=2)
    monkeypatch.setattr(collector_module, "NATS_JOIN_BACKOFF", Backoff(0.01, 0.01))
    peer = make_account(1)
    async with Collector(flaky, own_address=make_account(0).address) as collector:  # type: ignore[arg-type]
        await broker.connect(SWARM).publish(
            sign_group(peer, make_group(peer)), family="basic_arithmetic"
        )
        await collector.wait_accepted(1, timeout=10)
    assert flaky.calls == 3


async def test_a_collector_gives_up_after_the_join_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flaky = Flaky(MemoryBroker().connect(SWARM), failures=10**9)
    monkeypatch.setattr(collector_module, "NATS_JOIN_BACKOFF", Backoff(0.01, 0.01))
    monkeypatch.setattr(collector_module, "NATS_JOIN_TIMEOUT_S", 0.05)

    async def start_and_stop() -> None:
        with anyio.fail_after(10):
            async with Collector(flaky, own_address=make_account(0).address):  # type: ignore[arg-type]
                pass

    with pytest.raises(Exception) as err:  # noqa: PT011 - the actor wraps it
        await start_and_stop()
    assert "cannot reach JetStream" in repr(err.value) + repr(err.value.__cause__)
    assert flaky.calls >= 2
