"""A node whose commitments cannot land pauses its rounds at ``ledger.max_pending`` and
resumes, with nothing dropped, once the chain answers again."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

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


async def _wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.05)


@pytest.mark.timeout(400)
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
        await node.wait_rounds(1, timeout=120)
        await recorder.wait_idle(60)
        os.kill(pid, signal.SIGSTOP)  # the chain stops answering; the node keeps training
        try:
            await _wait_for(lambda: node.round_loop.pacing.backlog_paused, timeout_s=240)
            paused_at = node.round_loop.history.count
            # Paused with one round over the bound journaled, none dropped.
            assert recorder.statistics().pending == MAX_PENDING + 1
        finally:
            os.kill(pid, signal.SIGCONT)
        await node.wait_rounds(8, timeout=240)
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
