"""A node in sleep mode puts its engine to sleep around each step and wakes it with the
new weights (the vLLM backend's contract, here with a recording stand-in)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from sapo_async.actors import ActorState
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.swarm import Swarm
from sapo_async.wire import SamplingParams

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SleepyGenerator:
    """Generates with the real transformers generator; records sleep/wake like vLLM's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, int | None]] = []
        self.asleep = False
        self.model_id = inner.model_id

    async def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int, seed: int | None = None
    ):
        assert not self.asleep, "generated while asleep"
        self.calls.append(("generate", None))
        return await self.inner.generate(prompts, sampling, n=n, seed=seed)

    async def sleep(self) -> None:
        self.asleep = True
        self.calls.append(("sleep", None))

    async def wake_up(
        self, named_tensors: Iterable[Any] | None = None, *, policy_version: int | None = None
    ) -> None:
        assert named_tensors is not None
        assert len(list(named_tensors)) > 0
        self.asleep = False
        self.calls.append(("wake_up", policy_version))

    async def sync_weights(self, named_tensors: Iterable[Any]) -> None:
        raise AssertionError("sleep mode syncs through wake_up")

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_sleep_mode_sleeps_around_every_step_and_wakes_with_the_new_version():
    broker = MemoryBroker()
    node = await Swarm.join(
        swarm="sleepy",
        regime="dense",
        local=4,
        external=0,
        questions_per_round=4,
        completions_per_question=4,
        ledger_enabled=False,
        transport=broker.connect("sleepy"),
        rounds=None,
    )
    try:
        assert node.state is ActorState.RUNNING
        node.request_stop()  # drive the rounds by hand below
        await node.round_loop.wait_done()
        sleepy = SleepyGenerator(node.learner.generator)
        node.learner.generator = sleepy  # type: ignore[assignment]
        node.round_loop.sleep_mode = True
        for _ in range(3):
            await node.round_loop.step()
    finally:
        await node.leave()
    assert node.state is ActorState.STOPPED
    assert node.collector.state is ActorState.STOPPED
    await node.leave()  # idempotent
    kinds = [k for k, _ in sleepy.calls]
    assert kinds == ["generate", "sleep", "wake_up"] * 3
    versions = [v for k, v in sleepy.calls if k == "wake_up"]
    assert versions == [r.policy_version for r in node.reports]
