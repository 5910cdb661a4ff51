"""Every example in examples/ runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.nats, pytest.mark.evm]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
async def test_local_swarm_example_runs_and_nodes_share(no_leaks):
    summary = await load("local_swarm").main(rounds=3)
    assert set(summary) == {"ada", "bob", "cyd"}
    for stats in summary.values():
        assert stats["rounds"] == 3
        assert stats["shared"] == 12  # 4 groups a round, all acknowledged
