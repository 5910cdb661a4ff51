"""What a node's round reports count: each event once, in the round it happened."""

from __future__ import annotations

from collections import Counter

import pytest

from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.swarm import Swarm

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.timeout(300)
async def test_round_reports_count_each_rejection_once_not_again_every_round():
    # Reports used to carry the collector's running total, so status and Prometheus,
    # which add up reports, counted one rejection once per round after it.
    broker = MemoryBroker()
    async with Swarm.join(
        swarm="rejections",
        regime="dense",
        local=2,
        external=2,
        questions_per_round=2,
        completions_per_question=2,
        ledger_enabled=False,
        transport=broker.connect("rejections"),
        rounds=6,
    ) as node:
        await node.wait_rounds(1, timeout=120)
        for _ in range(3):
            assert node.collector.ingest(b"not an envelope") is None
        await node.wait_rounds(6, timeout=240)
        summed: Counter[str] = Counter()
        for report in node.reports:
            summed.update(report.rejections)
        assert sum(summed.values()) == 3
        assert summed == Counter(node.collector.statistics().rejected)
