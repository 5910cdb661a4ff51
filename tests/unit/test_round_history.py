"""RoundHistory: readers follow reports as rounds finish and learn how the rounds ended."""

from __future__ import annotations

import anyio
import pytest

from sapo_async.errors import ActorStopped, SapoError
from sapo_async.node import report as report_module
from sapo_async.node.report import RoundHistory
from tests.fixtures.reports import round_report

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_follower_gets_every_report_then_ends_when_the_history_closes() -> None:
    history = RoundHistory("n0")
    seen: list[int] = []

    async def follow() -> None:
        async for report in history.follow():
            seen.append(report.round)

    async with anyio.create_task_group() as tg:
        history.add(round_report(round=0))
        tg.start_soon(follow)
        await history.wait_count(1, timeout=5)
        history.add(round_report(round=1))
        history.add(round_report(round=2))
        history.close()
    assert seen == [0, 1, 2]


async def test_a_follower_of_failed_rounds_gets_the_failure_as_cause() -> None:
    history = RoundHistory("n0")
    history.add(round_report(round=0))
    history.close(RuntimeError("nan loss"))
    seen: list[int] = []

    async def follow() -> None:
        async for report in history.follow():
            seen.append(report.round)

    with pytest.raises(SapoError, match="node n0 failed") as err:
        await follow()
    assert seen == [0]
    assert isinstance(err.value.__cause__, RuntimeError)


async def test_waiting_for_more_rounds_than_will_come_raises_actor_stopped() -> None:
    history = RoundHistory("n0")
    history.add(round_report(round=0))
    history.close()
    await history.wait_count(1, timeout=1)
    with pytest.raises(ActorStopped):
        await history.wait_count(2, timeout=1)


async def test_only_the_newest_reports_are_kept_but_all_are_counted(monkeypatch) -> None:
    monkeypatch.setattr(report_module, "HISTORY_SIZE", 3)
    history = RoundHistory("n0")
    for r in range(5):
        history.add(round_report(round=r))
    history.close()
    assert [r.round for r in history.reports] == [2, 3, 4]
    assert history.count == 5
    assert [r.round async for r in history.follow()] == [2, 3, 4]
