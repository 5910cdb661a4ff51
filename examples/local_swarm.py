"""Three nodes in one process sharing rollouts through an embedded NATS server.

Run: python examples/local_swarm.py [ROUNDS]

Each node trains its own copy of the tiny model with GRPO on reasoning-gym's chain_sum,
training on 2 of its own question groups and 2 drawn from the others every round, and
records its commitments on the embedded EVM ledger.
"""

from __future__ import annotations

import sys
from contextlib import AsyncExitStack
from typing import Any

import anyio

from sapo_async import Swarm


async def main(rounds: int = 3) -> dict[str, dict[str, object]]:
    limiter = anyio.CapacityLimiter(2)  # two worker threads for three nodes on two cores
    common: dict[str, Any] = {
        "swarm": "example",
        "local": 2,
        "external": 2,
        "questions_per_round": 4,
        "rounds": rounds,
    }
    summary: dict[str, dict[str, object]] = {}
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(Swarm.join(name=name, limiter=limiter, **common))
            for name in ("ada", "bob", "cyd")
        ]
        for node in nodes:
            async for report in node.rounds():
                print(
                    f"{report.name} round {report.round}: reward {report.reward_mean:.3f}, "
                    f"shared {report.groups_shared}, external used {report.external_total}"
                )
            summary[node.name] = {
                "rounds": len(node.reports),
                "shared": sum(r.groups_shared for r in node.reports),
                "external": sum(r.external_total for r in node.reports),
            }
    return summary


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 3)
