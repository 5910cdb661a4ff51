"""The actor runtime: readiness, drain, failure, idempotent stop, no hangs."""

from __future__ import annotations

import anyio
import pytest

from sapo_async.actors import Actor, ActorState
from sapo_async.errors import ActorError, ActorFailed, ActorStopped

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_leaks")]


class Worker(Actor):
    """Serves until stopped, drains slowly enough to have in-flight work, and notes each
    hook it ran, in order."""

    def __init__(
        self,
        *,
        drain_delay: float = 0.0,
        fail_serving: bool = False,
        stop_itself: bool = False,
        **kw: float,
    ) -> None:
        super().__init__("worker", **kw)
        self.drain_delay = drain_delay
        self.fail_serving = fail_serving
        self.stop_itself = stop_itself
        self.ran: list[str] = []

    async def _setup(self) -> None:
        await anyio.sleep(0.01)
        self.ran.append("setup")

    async def _serve(self) -> None:
        self.ran.append("serve")
        await anyio.sleep(0)
        if self.fail_serving:
            raise ValueError("cannot serve")
        if self.stop_itself:
            self.stop_nowait()
        await anyio.sleep_forever()

    async def _drain(self) -> None:
        await anyio.sleep(self.drain_delay)
        self.ran.append("drained")

    async def _teardown(self) -> None:
        self.ran.append("torn_down")


async def test_actor_reports_ready_only_after_setup_and_is_running() -> None:
    actor = Worker()
    assert actor.state is ActorState.CREATED
    async with actor:
        assert actor.ran[0] == "setup"
        assert actor.state is ActorState.RUNNING
        assert actor.statistics().state is ActorState.RUNNING
    assert actor.state is ActorState.STOPPED
    assert actor.statistics().name == "worker"
    assert actor.ran[-1] == "torn_down"


async def test_stop_finishes_the_drain_before_tearing_down() -> None:
    async with Worker(drain_delay=0.05) as actor:
        await actor.stop()
        assert actor.state is ActorState.STOPPED
    assert actor.ran[-2:] == ["drained", "torn_down"]


async def test_drain_deadline_cancels_work_that_does_not_finish() -> None:
    actor = Worker(drain_delay=60, drain_timeout=0.2)
    with anyio.fail_after(5):
        async with actor:
            pass
    assert actor.state is ActorState.STOPPED
    assert "drained" not in actor.ran
    assert actor.ran[-1] == "torn_down"


async def test_stop_is_idempotent_and_waiting_on_a_stopped_actor_returns() -> None:
    actor = Worker()
    async with actor:
        await actor.stop()
        await actor.stop()
    await actor.stop()
    await actor.wait_stopped()
    assert actor.state is ActorState.STOPPED


async def test_waiting_on_a_never_started_actor_raises_instead_of_hanging() -> None:
    with pytest.raises(ActorStopped):
        await Worker().wait_stopped()


async def test_stopping_a_never_started_actor_marks_it_stopped() -> None:
    actor = Worker()
    await actor.stop()
    assert actor.state is ActorState.STOPPED
    assert actor.ran == []  # never set up, so nothing to tear down


async def test_failing_actor_surfaces_to_its_supervisor_as_actor_failed() -> None:
    actor = Worker(fail_serving=True)
    with pytest.raises(ExceptionGroup) as caught:  # noqa: PT012 - the failure arrives mid-block
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            await anyio.sleep_forever()
    (failure,) = caught.value.exceptions
    assert isinstance(failure, ActorFailed)
    assert failure.actor == "worker"
    assert isinstance(failure.__cause__, ValueError)
    assert actor.state is ActorState.FAILED
    assert actor.ran[-1] == "torn_down"
    await actor.wait_stopped()  # returns at once, never hangs


async def test_failing_actor_used_as_context_manager_raises_actor_failed() -> None:
    with pytest.raises(ExceptionGroup) as caught:
        async with Worker(fail_serving=True):
            await anyio.sleep_forever()
    assert caught.group_contains(ActorFailed)


async def test_an_actor_cannot_be_started_twice() -> None:
    actor = Worker()
    async with actor:
        with pytest.raises(ActorError, match="already started"):
            await actor.run()


async def test_cancelled_supervisor_still_leaves_a_stopped_actor() -> None:
    actor = Worker(drain_delay=60)
    with anyio.move_on_after(0.2):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            await anyio.sleep_forever()
    assert actor.state is ActorState.STOPPED
    assert actor.ran[-1] == "torn_down"


async def test_an_actor_can_ask_itself_to_stop_from_a_hook() -> None:
    actor = Worker(stop_itself=True)
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run)
        with anyio.fail_after(5):
            await actor.wait_stopped()
    assert actor.state is ActorState.STOPPED
    assert actor.ran == ["setup", "serve", "drained", "torn_down"]
