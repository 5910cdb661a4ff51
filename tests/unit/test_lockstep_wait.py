"""The lockstep harness waits for distinct messages, not deliveries.

JetStream redelivers a message whose ack came late; counting the redelivery ended the wait
while a message was still in flight, and that node drew from a smaller pool (a SmolLM2 run
left its common random numbers at round 9). Here: a real collector, in memory.
"""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from sapo_async.experiment import lockstep as lockstep_module
from sapo_async.experiment.lockstep import Lockstep
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.wire.signing import encode_signed, sign_group
from tests.fixtures.fabric import make_account, make_group

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_redelivered_message_counts_once_and_the_wait_holds_for_the_missing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lockstep_module, "RECEIVE_TIMEOUT_S", 0.5)
    me, peer = make_account(0), make_account(1)
    collector = Collector(MemoryBroker().connect("lockstep"), own_address=me.address)
    step = Lockstep([SimpleNamespace(collector=collector)])  # type: ignore[list-item]
    first, second = (encode_signed(sign_group(peer, make_group(peer, index=i))) for i in range(2))
    collector.ingest(first)
    collector.ingest(first)  # redelivered: a duplicate, the second one still in flight
    assert collector.statistics().received == 2
    assert step.distinct(0) == 1
    with pytest.raises(TimeoutError):
        await step.wait_received([0], 2)
    collector.ingest(second)
    with anyio.fail_after(5):
        await step.wait_received([0], 2)
