"""The experiments' lockstep harness: n nodes over the in-memory broker, round by round.

Harness, not product. The paper table (:mod:`.paper_table`) and the attack experiment
(:mod:`.attack.runner`) both run the product's round
(:class:`~sapo_async.node.rounds.RoundLoop`: generate, sign, publish, verify, re-derive,
score, sample, train) on nodes assembled as every node is
(:func:`~sapo_async.node.swarm.assemble`), over one
:class:`~sapo_async.fabric.transport.memory.MemoryBroker`, the ledger off, and drive them
in lockstep: every node shares round r (:meth:`Lockstep.share`), the caller waits until the
collectors have seen the round's groups, then every node trains (:meth:`Lockstep.train`).
In the product no node waits for another; here the lockstep only removes timing noise.

Common random numbers: node i's key is derived from ``(key_label, i)``, so hashes, hence
the sampler's canonical candidate order, repeat across runs; questions and sampling seeds
are keyed by (seed, node, round) as in the product.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Protocol

from eth_account import Account

from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.groups import SharedRound
from sapo_async.node.report import RoundReport
from sapo_async.node.rounds import RoundLoop
from sapo_async.node.spec import NodeSpec
from sapo_async.node.swarm import Cleanup, PublisherFactory, assemble, complete_spec
from sapo_async.wire import keccak256

__all__ = ["Lockstep", "SizedRun", "lockstep", "lockstep_spec"]


class SizedRun(Protocol):
    """What an experiment's spec says about every node's round (paper table and attack)."""

    @property
    def regime(self) -> Any: ...
    @property
    def questions_per_round(self) -> int: ...
    @property
    def completions_per_question(self) -> int: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def lr(self) -> float: ...


def lockstep_spec(
    run: SizedRun, *, swarm: str, local: int, external: int, seed: int, **extra: Any
) -> NodeSpec:
    """The spec every node of a lockstep run shares: the tiny model of ``run.regime``, its
    round sizes and learning rate, I/J, the freshest external groups only (one round of
    lockstep is one round behind at most), no ledger; ``extra`` as :meth:`NodeSpec.build`."""
    from sapo_async.policy.grpo.config import TrainerConfig

    return NodeSpec.build(
        swarm=swarm,
        model="tiny",
        regime=run.regime,
        seed=seed,
        questions_per_round=run.questions_per_round,
        completions_per_question=run.completions_per_question,
        max_new_tokens=run.max_new_tokens,
        trainer=TrainerConfig(lr=run.lr),
        local=local,
        external=external,
        max_staleness_rounds=0,
        ledger_enabled=False,
        **extra,
    )


class Lockstep:
    """Nodes driven round by round (see the module docstring); ``nodes[i]`` is node i."""

    def __init__(self, nodes: list[RoundLoop]) -> None:
        self.nodes = nodes

    async def share(self, i: int) -> SharedRound:
        """Node ``i`` generates, publishes and scores its groups of its current round."""
        return await self.nodes[i].share_round()

    async def train(self, i: int, shared: SharedRound) -> RoundReport:
        """Node ``i`` chooses, trains on and reports the round it shared."""
        return await self.nodes[i].train_round(shared)


@asynccontextmanager
async def lockstep(
    common: NodeSpec,
    nodes: int,
    *,
    key_label: str,
    spec_of: Callable[[int, NodeSpec], NodeSpec] | None = None,
    publisher_of: Callable[[int], PublisherFactory | None] | None = None,
) -> AsyncIterator[Lockstep]:
    """Assemble ``nodes`` nodes from ``common`` over one in-memory broker, their collectors
    serving while the block runs.

    Node i is ``common`` with name ``node<i>``, task slot i, the key derived from
    ``f"{key_label}:{i}"``, reading the stream from its start; ``spec_of(i, spec)`` may
    change it further (its own model), ``publisher_of(i)`` give it another publisher (an
    attacker's; None: the product's).

    Raises:
        ConfigError: an invalid setting.
    """
    broker = MemoryBroker()
    loops: list[RoundLoop] = []
    cleanups: list[Cleanup] = []
    for i in range(nodes):
        account = Account.from_key(keccak256(f"{key_label}:{i}".encode()))
        spec = common.replace(
            name=f"node{i}",
            node_index=i,
            account=account,
            transport=broker.connect(common.swarm),
            start="all",
        )
        if spec_of is not None:
            spec = spec_of(i, spec)
        publisher = (publisher_of(i) if publisher_of is not None else None) or Publisher
        parts = await assemble(complete_spec(spec), cleanups, publisher=publisher, offload=False)
        loops.append(parts.round_loop(offload=False))
    async with AsyncExitStack() as stack:
        for cleanup in cleanups:
            stack.push_async_callback(cleanup)
        for loop in loops:
            await stack.enter_async_context(loop.collector)
        yield Lockstep(loops)
