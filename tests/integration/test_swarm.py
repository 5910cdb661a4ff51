"""Whole nodes on a real nats-server, the tiny model, real scoring and the embedded EVM."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from sapo_async.ledger.audit import audit_node
from sapo_async.node.embedded import embedded_ledger
from sapo_async.node.lifecycle import Node
from sapo_async.node.swarm import Swarm

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.nats, pytest.mark.evm]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def producers_used(node: Node) -> Counter[str]:
    used: Counter[str] = Counter()
    for report in node.reports:
        used.update(report.external_used)
    return used


async def wait_until(predicate, *, timeout: float, nodes: list[Node]) -> None:
    """Wait, round by round, until ``predicate()`` holds."""
    with anyio.fail_after(timeout):
        while not predicate():
            await nodes[0].wait_rounds(len(nodes[0].reports) + 1, timeout=timeout)


@pytest.mark.timeout(600)
async def test_three_nodes_share_train_on_each_other_and_survive_a_pause_and_a_kill(no_leaks):
    limiter = anyio.CapacityLimiter(2)
    nodes: list[Node] = []
    try:
        for i in range(3):
            nodes.append(
                await Swarm.join(
                    swarm="it-three",
                    regime="dense",
                    local=2,
                    external=4,
                    questions_per_round=4,
                    completions_per_question=4,
                    name=f"n{i}",
                    node_index=i,
                    limiter=limiter,
                )
            )
        addresses = {n.address for n in nodes}

        def everyone_used_everyone() -> bool:
            return all(set(producers_used(n)) == addresses - {n.address} for n in nodes)

        await wait_until(everyone_used_everyone, timeout=300, nodes=nodes)
        for n in nodes:
            assert n.address not in producers_used(n), (
                "a node must never train on its own groups as external"
            )
            assert all(r.groups_shared == 4 for r in n.reports)

        # Pause n2: the others keep completing rounds without it.
        nodes[2].round_loop.pause()
        paused_at = len(nodes[2].reports)
        for n in nodes[:2]:
            await n.wait_rounds(len(n.reports) + 3, timeout=120)
        assert len(nodes[2].reports) <= paused_at + 1  # at most the round in flight finished
        nodes[2].round_loop.resume()
        await nodes[2].wait_rounds(len(nodes[2].reports) + 1, timeout=120)

        # Kill n2 (it leaves mid-round): the others still go on.
        await nodes[2].leave()
        for n in nodes[:2]:
            await n.wait_rounds(len(n.reports) + 2, timeout=120)

        # The ledger's audit agrees with what the nodes did.
        for n in nodes[:2]:
            n.request_stop()
        for n in nodes[:2]:
            with anyio.fail_after(120):
                await n.round_loop.wait_done()
            assert n.recorder is not None
            await n.recorder.wait_idle(60)
        for n in nodes[:2]:
            # Credit claims settle after the commitments land (one transaction each): under
            # load they were still open when the sums below were read (21 credited of 34).
            assert n.recorder is not None
            await n.recorder.wait_credit_settled(120)
        handle = embedded_ledger("it-three")
        assert handle is not None
        for n in nodes[:2]:
            stats = await handle.ledger.node_stats(n.address)
            assert stats.rounds_committed == len(n.reports)
            assert stats.rollouts_committed == sum(r.groups_shared for r in n.reports)
            assert stats.external_used == sum(r.external_total for r in n.reports)
            # The totals-only audit (what `sapo-async swarm` prints) reads the same numbers.
            quick = await audit_node(handle.ledger, n.address, breakdown=False)
            assert quick.participation.rounds_committed == stats.rounds_committed
            assert quick.participation.external_used == stats.external_used
            assert quick.usage_by_producer == {}
            # Usage credit on chain matches, producer by producer, what n reported using.
            for producer, used in producers_used(n).items():
                credits = await handle.ledger.usage_credits(producer=producer, consumer=n.address)
                assert sum(c.count for c in credits) == used
    finally:
        for n in reversed(nodes):
            await n.leave()
