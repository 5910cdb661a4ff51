"""A lone node (J = 0) on the in-memory fabric: what ``sapo-async train`` runs.

Owns nothing of a round: the lone node is assembled as every node is
(:func:`~sapo_async.node.swarm.assemble`), over a private in-memory broker, the ledger and
the defences off, I = B own groups and J = 0, and its rounds are the round loop's
(:meth:`~sapo_async.node.rounds.RoundLoop.step`), each reported as a
:class:`~sapo_async.node.report.RoundReport`. Its groups are signed and published to the
private broker like any node's; nobody else reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
from eth_account import Account

from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.learner import Learner
from sapo_async.node.report import RoundReport
from sapo_async.node.spec import NodeSpec
from sapo_async.node.swarm import assemble, complete_spec

__all__ = ["run_alone", "train_alone"]

ALONE_SWARM = "alone"
"""The private swarm a lone node publishes to."""


async def train_alone(
    learner: Learner,
    rounds: int,
    *,
    on_round: Callable[[RoundReport], None] | None = None,
) -> list[RoundReport]:
    """Run ``rounds`` rounds of ``learner`` alone (J = 0) from its current round.

    Args:
        learner: the learner (its settings give B, L and the seeds).
        rounds: how many rounds.
        on_round: called after each round (progress display, JSONL log, checkpoints).

    Returns:
        The rounds' reports.

    Raises:
        GenerationError, TrainingError: from the generator or the trainer.
    """
    settings = learner.settings
    broker = MemoryBroker()
    spec = complete_spec(
        NodeSpec.build(
            swarm=ALONE_SWARM,
            name="alone",
            account=Account.create(),
            node_index=settings.node_index,
            seed=settings.swarm_seed,
            questions_per_round=settings.questions_per_round,
            completions_per_question=settings.completions_per_question,
            local=settings.questions_per_round,
            external=0,
            transport=broker.connect(ALONE_SWARM),
            ledger_enabled=False,
            defence_active=False,
        )
    )
    out: list[RoundReport] = []
    async with AsyncExitStack() as stack:
        parts = await assemble(spec, stack, learner=learner, offload=False)
        loop = parts.round_loop(offload=False)
        await stack.enter_async_context(parts.collector)
        for _ in range(rounds):
            report = await loop.step()
            out.append(report)
            if on_round is not None:
                on_round(report)
    return out


def run_alone(
    learner: Learner,
    rounds: int,
    *,
    on_round: Callable[[RoundReport], None] | None = None,
) -> list[RoundReport]:
    """:func:`train_alone` from synchronous code (blocking)."""
    return anyio.run(lambda: train_alone(learner, rounds, on_round=on_round))
