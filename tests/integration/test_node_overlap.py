"""The overlapped round loop: round r+1 is generated while round r trains."""

from __future__ import annotations

import anyio
import pytest
import torch

from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.swarm import Swarm
from sapo_async.wire.signing import decode_body, decode_signed

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.timeout(300)
async def test_overlapped_node_generates_from_its_own_synced_copy_one_version_behind():
    broker = MemoryBroker()
    async with Swarm.join(
        swarm="overlap",
        regime="dense",
        local=4,
        external=0,
        questions_per_round=4,
        completions_per_question=4,
        ledger_enabled=False,
        transport=broker.connect("overlap"),
        overlap=True,
        rounds=5,
    ) as node:
        await node.wait_rounds(5, timeout=240)
        reports = node.reports
        assert [r.round for r in reports] == [0, 1, 2, 3, 4]
        generator_model = node.learner.generator.model  # type: ignore[attr-defined]
        assert generator_model is not node.learner.model
        with anyio.fail_after(30):
            await node.round_loop.wait_done()
        # After the last sync, the generator's copy equals the trained weights.
        for (name, a), (_, b) in zip(
            generator_model.named_parameters(), node.learner.model.named_parameters(), strict=True
        ):
            assert torch.equal(a, b), name
        # The groups of round r+1 were generated before round r's step finished: their
        # policy version is at most the one round r trained from.
        stream = broker.stream("overlap")
        versions = {}
        for seq in range(1, 1 + 4 * 6):
            stored = stream.get(seq)
            if stored is None:
                continue
            group = decode_body(decode_signed(stored.data).body)
            versions.setdefault(group.producer_round, set()).add(group.policy_version)
        steps_before = {
            r.round: r.policy_version - (1 if not r.step["skipped"] else 0) for r in reports
        }
        for round_, seen in versions.items():
            if round_ >= 1 and round_ - 1 in steps_before:
                assert max(seen) <= steps_before[round_ - 1]
