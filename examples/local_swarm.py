"""Three nodes in one process sharing rollouts through an embedded NATS server.

Run: python examples/local_swarm.py [ROUNDS]

Each node trains its own copy of the tiny model with GRPO on reasoning-gym's chain_sum
(the dense-reward regime: a near miss earns partial credit, so most question groups have
rewards that differ and are worth training on). Every round a node answers 8 questions 8
times each, shares the 8 groups, and trains on 4 of its own and 4 drawn from what the
others shared (fewer in its first round, before they have shared anything), each scored
again by its own verifier; it records a commitment to both on the embedded EVM ledger. The
last lines sum up each node: rounds, mean reward over its first and last quarter of
rounds, external groups trained on (from how many producers) and commitments on chain.
Twenty rounds show sharing, not learning: the dense regime starts near 0.1 and moves little
in so few rounds, so first and last differ by noise (the paper's comparison, docs/swarm.md,
takes 80 to 200 rounds per node).

The library is silent unless the application configures :mod:`logging`; to see its
events, add ``logging.basicConfig(level=logging.INFO)`` (``sapo_async`` is the logger).
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import AsyncExitStack
from statistics import mean
from typing import Any

import anyio

from sapo_async import Node, RoundReport, Swarm

LEDGER_WAIT_S = 120.0
"""How long the summary waits for the last commitments to land (seconds, not minutes, on
the embedded chain; generous for a loaded machine)."""


def round_line(report: RoundReport) -> str:
    return (
        f"{report.name} round {report.round}: reward {report.reward_mean:.3f}, "
        f"shared {report.groups_shared}, external used {report.external_total}"
    )


async def summarise(node: Node) -> dict[str, Any]:
    """A node's totals, once its last commitments are on chain."""
    reports = node.reports
    used: Counter[str] = Counter()
    for report in reports:
        used.update(report.external_used)
    landed = 0
    if node.recorder is not None:
        await node.recorder.wait_idle(LEDGER_WAIT_S)
        landed = node.recorder.statistics().landed
    window = max(1, len(reports) // 4)  # one round's reward is noisy: average a quarter
    return {
        "rounds": len(reports),
        "reward_first": mean(r.reward_mean for r in reports[:window]),
        "reward_last": mean(r.reward_mean for r in reports[-window:]),
        "window": window,
        "shared": sum(r.groups_shared for r in reports),
        "external": sum(used.values()),
        "producers": len(used),
        "committed": landed,
    }


async def main(rounds: int = 20) -> dict[str, dict[str, Any]]:
    limiter = anyio.CapacityLimiter(2)  # two worker threads for three nodes on two cores
    common: dict[str, Any] = {"swarm": "example", "regime": "dense", "rounds": rounds}
    summary: dict[str, dict[str, Any]] = {}
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(Swarm.join(name=name, limiter=limiter, **common))
            for name in ("ada", "bob", "cyd")
        ]

        async def follow(node: Node) -> None:
            async for report in node.rounds():
                print(round_line(report))

        async with anyio.create_task_group() as tg:
            for node in nodes:
                tg.start_soon(follow, node)
        for node in nodes:
            summary[node.name] = await summarise(node)
    for name, s in summary.items():
        print(
            f"{name}: {s['rounds']} rounds, reward {s['reward_first']:.3f} (first "
            f"{s['window']}) -> {s['reward_last']:.3f} (last {s['window']}), "
            f"{s['external']} external groups used from "
            f"{s['producers']} producers, {s['committed']} commitments on chain"
        )
    return summary


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 20)
