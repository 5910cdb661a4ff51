"""What a node's round reports count: each event once, in the round it happened."""

from __future__ import annotations

from collections import Counter

import pytest

from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.swarm import Swarm
from sapo_async.ops.metrics import NodeMetrics
from sapo_async.ops.status import StatusState

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
        # What a volunteer reads: Prometheus' sapo_rejections_total and the live table's
        # total (the issue saw 30 rejections logged and 7,037 in the metric).
        metrics, state = NodeMetrics(), StatusState()
        for report in node.reports:
            metrics.observe_round(report, node="n")
            state.update(report)
        scraped = sum(
            sample.value
            for family in metrics.registry.collect()
            if family.name == "sapo_rejections"
            for sample in family.samples
            if sample.name == "sapo_rejections_total"
        )
        assert scraped == 3
        assert sum(state.rejections.values()) == 3
