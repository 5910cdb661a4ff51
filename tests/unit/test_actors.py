"""The actor runtime: readiness, backpressure, drain, failure, idempotent stop, no hangs."""

from __future__ import annotations

import anyio
import pytest

from sapo_async.actors import Actor, ActorState
from sapo_async.errors import ActorError, ActorFailed, ActorStopped

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_leaks")]


class Recorder(Actor[int]):
    """Handles ints slowly enough that drain has in-flight work to finish."""

    def __init__(self, *, delay: float = 0.0, fail_on: int | None = None, **kw: object) -> None:
        super().__init__("recorder", **kw)  # type: ignore[arg-type]
        self.delay = delay
        self.fail_on = fail_on
        self.seen: list[int] = []
        self.setup_done = False
        self.drained = False
        self.torn_down = False

    async def _setup(self) -> None:
        await anyio.sleep(0.01)
        self.setup_done = True

    async def _handle(self, message: int) -> None:
        if message == self.fail_on:
            raise ValueError(f"cannot handle {message}")
        await anyio.sleep(self.delay)
        self.seen.append(message)

    async def _drain(self) -> None:
        self.drained = True

    async def _teardown(self) -> None:
        self.torn_down = True


async def test_actor_reports_ready_only_after_setup_and_is_running() -> None:
    actor = Recorder()
    assert actor.state is ActorState.CREATED
    async with actor:
        assert actor.setup_done
        assert actor.state is ActorState.RUNNING
    assert actor.state is ActorState.STOPPED
    assert actor.torn_down


async def test_stop_drains_queued_and_in_flight_messages_before_stopping() -> None:
    async with Recorder(delay=0.01, mailbox_size=16) as actor:
        for i in range(10):
            await actor.send(i)
        await actor.stop()
        assert actor.seen == list(range(10))
        assert actor.drained
        assert actor.statistics().handled == 10


async def test_full_mailbox_applies_backpressure_to_senders() -> None:
    async with Recorder(delay=10, mailbox_size=2, drain_timeout=0.2) as actor:
        await actor.send(0)  # taken by the handler, which then sleeps
        with anyio.fail_after(2):
            while actor.statistics().mailbox.size != 0:
                await anyio.sleep(0.001)
        actor.send_nowait(1)
        actor.send_nowait(2)
        with pytest.raises(anyio.WouldBlock):
            actor.send_nowait(3)
        stats = actor.statistics()
        assert stats.mailbox.size == 2
        assert stats.mailbox.capacity == 2


async def test_drain_deadline_cancels_work_that_does_not_finish() -> None:
    actor = Recorder(delay=60, drain_timeout=0.2)
    async with actor:
        await actor.send(1)
    assert actor.state is ActorState.STOPPED
    assert actor.seen == []
    assert actor.torn_down


async def test_sending_to_a_stopped_actor_raises_actor_stopped() -> None:
    async with Recorder() as actor:
        pass
    with pytest.raises(ActorStopped):
        await actor.send(1)
    with pytest.raises(ActorStopped):
        actor.send_nowait(1)


async def test_sender_blocked_on_a_full_mailbox_gets_actor_stopped_not_a_hang() -> None:
    actor = Recorder(delay=60, mailbox_size=0, drain_timeout=0.2)
    outcome: list[BaseException] = []

    async def blocked_sender() -> None:
        try:
            await actor.send(2)
        except ActorStopped as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        await tg.start(actor.run)
        await actor.send(1)  # the handler holds this one for 60 s
        tg.start_soon(blocked_sender)
        with anyio.fail_after(2):
            while actor.statistics().mailbox.senders_waiting == 0:
                await anyio.sleep(0.001)
        with anyio.fail_after(5):
            await actor.stop()
    assert len(outcome) == 1


async def test_stop_is_idempotent_and_waiting_on_a_stopped_actor_returns() -> None:
    actor = Recorder()
    async with actor:
        await actor.stop()
        await actor.stop()
    await actor.stop()
    await actor.wait_stopped()
    assert actor.state is ActorState.STOPPED


async def test_waiting_on_a_never_started_actor_raises_instead_of_hanging() -> None:
    with pytest.raises(ActorStopped):
        await Recorder().wait_stopped()


async def test_stopping_a_never_started_actor_marks_it_stopped() -> None:
    actor = Recorder()
    await actor.stop()
    assert actor.state is ActorState.STOPPED
    with pytest.raises(ActorStopped):
        await actor.send(1)


async def test_failing_actor_surfaces_to_its_supervisor_as_actor_failed() -> None:
    actor = Recorder(fail_on=3)
    with pytest.raises(ExceptionGroup) as caught:  # noqa: PT012 - the failure arrives mid-block
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            for i in range(5):
                await actor.send(i)
            await anyio.sleep_forever()
    (failure,) = caught.value.exceptions
    assert isinstance(failure, ActorFailed)
    assert failure.actor == "recorder"
    assert isinstance(failure.__cause__, ValueError)
    assert actor.state is ActorState.FAILED
    assert actor.torn_down
    with pytest.raises(ActorStopped):
        await actor.send(9)
    await actor.wait_stopped()  # returns at once, never hangs


async def test_failing_actor_used_as_context_manager_raises_actor_failed() -> None:
    with pytest.raises(ExceptionGroup) as caught:  # noqa: PT012
        async with Recorder(fail_on=0) as actor:
            await actor.send(0)
            await anyio.sleep_forever()
    assert caught.group_contains(ActorFailed)


async def test_an_actor_cannot_be_started_twice() -> None:
    actor = Recorder()
    async with actor:
        with pytest.raises(ActorError, match="already started"):
            await actor.run()


async def test_cancelled_supervisor_still_leaves_a_stopped_actor() -> None:
    actor = Recorder(delay=60)
    with anyio.move_on_after(0.2):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            await actor.send(1)
            await anyio.sleep_forever()
    assert actor.state is ActorState.STOPPED
    assert actor.torn_down


async def test_an_actor_can_ask_itself_to_stop_from_a_hook() -> None:
    class StopsOnNegative(Recorder):
        async def _handle(self, message: int) -> None:
            if message < 0:
                self.stop_nowait()
            await super()._handle(message)

    actor = StopsOnNegative()
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run)
        await actor.send(1)
        await actor.send(-1)
        with anyio.fail_after(5):
            await actor.wait_stopped()
    assert actor.state is ActorState.STOPPED
    assert actor.seen == [1, -1]
