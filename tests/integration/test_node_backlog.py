"""A node whose commitments cannot land pauses its rounds at ``ledger.max_pending`` and
resumes, with nothing dropped, once the chain answers again."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from eth_account import Account

from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.ledger.anvil import ANVIL_DEV_KEY, AnvilProcess
from sapo_async.ledger.deploy import deploy_ledger
from sapo_async.ledger.rpc import rpc_chain
from sapo_async.node.swarm import Swarm
from sapo_async.ops.metrics import NodeMetrics
from sapo_async.ops.status import report_log_fields

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.evm, pytest.mark.anvil]

MAX_PENDING = 2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


ROUND_TIMEOUT_S = 300
"""Longest one round may take: a stuck round, not a slow machine. Waits here are counted in
rounds (each restarts this clock), so a loaded machine makes the test slower, not fail."""


async def _next_round_or_pause(node: Any, count: int) -> None:
    """Return once round ``count + 1`` is done or rounds pause for the backlog."""
    async with anyio.create_task_group() as tg:

        async def first(wait: Callable[[], Awaitable[None]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        tg.start_soon(first, node.round_loop.pacing.wait_paused)
        tg.start_soon(first, lambda: node.wait_rounds(count + 1, timeout=ROUND_TIMEOUT_S))


@pytest.mark.timeout(3600)  # a bound for a hung test; the waits are per round
async def test_rounds_pause_at_the_backlog_bound_and_resume_when_the_chain_returns(
    tmp_path: Path, anvil_chain: AnvilProcess
):
    dev = Account.from_key(ANVIL_DEV_KEY)
    ledger = await deploy_ledger(rpc_chain(anvil_chain.url), dev, "backlog")
    assert anvil_chain.process is not None
    assert anvil_chain.process.pid is not None
    pid = anvil_chain.process.pid
    async with Swarm.join(
        swarm="backlog",
        regime="dense",
        local=2,
        external=0,
        questions_per_round=2,
        completions_per_question=2,
        transport=MemoryBroker().connect("backlog"),
        ledger_rpc_url=anvil_chain.url,
        ledger_contract_address=ledger.address,
        ledger_relayer_key=ANVIL_DEV_KEY,
        ledger_journal_path=tmp_path / "journal.sqlite",
        ledger_max_pending=MAX_PENDING,
        rounds=8,
    ) as node:
        recorder = node.recorder
        assert recorder is not None
        await node.wait_rounds(1, timeout=ROUND_TIMEOUT_S)
        await recorder.wait_idle(60)
        os.kill(pid, signal.SIGSTOP)  # the chain stops answering; the node keeps training
        try:
            stopped_at = node.round_loop.history.count
            # Each round after the stop journals one commitment that cannot land: rounds
            # pause within MAX_PENDING + 2 rounds (one may have been under way at the stop).
            while not node.round_loop.pacing.backlog_paused:
                count = node.round_loop.history.count
                assert count <= stopped_at + MAX_PENDING + 2, "rounds ran past the bound"
                await _next_round_or_pause(node, count)
            paused_at = node.round_loop.history.count
            # Paused with one round over the bound journaled, none dropped.
            assert recorder.statistics().pending == MAX_PENDING + 1
        finally:
            os.kill(pid, signal.SIGCONT)
        for count in range(paused_at + 1, 9):  # one round at a time, each on its own clock
            await node.wait_rounds(count, timeout=ROUND_TIMEOUT_S)
        await recorder.wait_idle(120)
    reports = node.reports
    assert max(r.commitments_pending for r in reports) <= MAX_PENDING + 1
    resumed = reports[paused_at]
    assert resumed.backlog_wait_s > 0
    assert report_log_fields(resumed)["backlog_wait_s"] == resumed.backlog_wait_s
    metrics = NodeMetrics()
    for report in reports:
        metrics.observe_round(report, node="n")
    waited = metrics.registry.get_sample_value("sapo_backlog_wait_seconds_total", {"node": "n"})
    assert waited == pytest.approx(sum(r.backlog_wait_s for r in reports))
    assert await ledger.rounds_of(node.address) == list(range(8))
