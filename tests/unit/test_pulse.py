"""The pulse: a fire wakes every task waiting then, a later waiter waits for the next fire,
and no wake-up is lost when fires and waits interleave."""

from __future__ import annotations

import random

import anyio
import pytest
from anyio.abc import TaskStatus

from sapo_async.pulse import Pulse

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_leaks")]


async def _wait_and_note(
    pulse: Pulse, woken: list[int], i: int, *, task_status: TaskStatus[None]
) -> None:
    task_status.started()
    await pulse.wait()
    woken.append(i)


async def test_a_fire_wakes_every_task_waiting_then() -> None:
    pulse = Pulse()
    woken: list[int] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(5):
                await tg.start(_wait_and_note, pulse, woken, i)
            await anyio.wait_all_tasks_blocked()
            assert woken == []
            pulse.fire()
    assert sorted(woken) == list(range(5))


async def test_a_waiter_that_arrives_after_a_fire_waits_for_the_next_one() -> None:
    pulse = Pulse()
    woken: list[int] = []
    pulse.fire()  # nobody waits: not remembered
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(_wait_and_note, pulse, woken, 1)
            await anyio.wait_all_tasks_blocked()
            assert woken == []  # the earlier fire did not wake it
            pulse.fire()
    assert woken == [1]


async def test_a_woken_task_that_waits_again_waits_for_a_new_fire() -> None:
    pulse = Pulse()
    woken: list[int] = []

    async def twice(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        for i in range(2):
            await pulse.wait()
            woken.append(i)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(twice)
            await anyio.wait_all_tasks_blocked()
            pulse.fire()
            pulse.fire()  # before the woken task ran again: it wakes once for both
            await anyio.wait_all_tasks_blocked()
            assert woken == [0]
            pulse.fire()
    assert woken == [0, 1]


async def test_a_cancelled_waiter_leaves_the_pulse_working() -> None:
    pulse = Pulse()
    woken: list[int] = []
    with anyio.move_on_after(0):
        await pulse.wait()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(_wait_and_note, pulse, woken, 1)
            await anyio.wait_all_tasks_blocked()
            pulse.fire()
    assert woken == [1]


@pytest.mark.parametrize("seed", range(5))
async def test_no_wake_up_is_lost_when_fires_and_waits_interleave(seed: int) -> None:
    # Consumers check a counter and wait; a producer bumps it and fires at random moments.
    # A lost wake-up leaves a consumer waiting for a fire that never comes: fail_after
    # turns that hang into a failure.
    rng = random.Random(seed)
    pulse = Pulse()
    total = 500
    produced = 0
    seen = [0] * 4

    async def consume(k: int) -> None:
        while seen[k] < total:
            if produced > seen[k]:
                seen[k] = produced
                if rng.random() < 0.5:
                    await anyio.lowlevel.checkpoint()
                continue
            await pulse.wait()

    async def produce() -> None:
        nonlocal produced
        for _ in range(total):
            produced += 1
            pulse.fire()
            for _ in range(rng.randrange(3)):
                await anyio.lowlevel.checkpoint()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for k in range(len(seen)):
                tg.start_soon(consume, k)
            tg.start_soon(produce)
    assert seen == [total] * len(seen)
