"""The experiments' lockstep harness: n nodes over one transport, round by round.

Harness, not product. The paper table (:mod:`.paper_table`) and the attack experiment
(:mod:`.attack.runner`) both run the product's round
(:class:`~sapo_async.node.rounds.RoundLoop`: generate, sign, publish, verify, re-derive,
score, sample, train) on nodes assembled as every node is
(:func:`~sapo_async.node.swarm.assemble`), the ledger off, and drive them in lockstep:
every node shares round r (:meth:`Lockstep.share`), the caller waits until the collectors
have seen the round's messages (:meth:`Lockstep.wait_received`), then every node trains
(:meth:`Lockstep.train`). In the product no node waits for another; here the lockstep only
removes timing noise.

Two transports (:data:`TRANSPORTS`): ``"memory"``, one
:class:`~sapo_async.fabric.transport.memory.MemoryBroker` in the process; or ``"nats"``, a
private nats-server with JetStream (:class:`~sapo_async.fabric.transport.embedded.EmbeddedNats`,
a temporary store) started for the block, each node opening its own connection and
creating the swarm's stream as a product node does (its spec names the server's URL, so
:func:`~sapo_async.node.swarm.assemble` connects it). The server is a separate process:
:attr:`Lockstep.server_pid` lets a caller measure its CPU.

Common random numbers: node i's key is derived from ``(key_label, i)``, so hashes, hence
the sampler's canonical candidate order, repeat across runs; questions and sampling seeds
are keyed by (seed, node, round) as in the product.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal, Protocol

import anyio
from eth_account import Account

from sapo_async.errors import ConfigError
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.groups import SharedRound
from sapo_async.node.report import RoundReport
from sapo_async.node.rounds import RoundLoop
from sapo_async.node.spec import NodeSpec
from sapo_async.node.swarm import PublisherFactory, assemble, complete_spec
from sapo_async.wire import keccak256

__all__ = ["TRANSPORTS", "Lockstep", "SizedRun", "TransportName", "lockstep", "lockstep_spec"]

TransportName = Literal["memory", "nats"]
TRANSPORTS: tuple[TransportName, ...] = ("memory", "nats")
"""The transports a lockstep run can share over (see the module docstring)."""

RECEIVE_TIMEOUT_S = 600.0
"""How long :meth:`Lockstep.wait_received` waits: a flood round on two shared cores delivers
thousands of messages per collector; a lost message fails the run instead of hanging it."""

RECEIVE_POLL_S = 0.002
"""The poll interval of :meth:`Lockstep.wait_received` (its loop is cheap; see there)."""


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
    lockstep is one round behind at most), no ledger; ``extra`` as :meth:`NodeSpec.build`,
    over these (``model=`` a loaded real model, ``train_layers=``, ``tasks=``)."""
    from sapo_async.policy.grpo.config import TrainerConfig

    settings: dict[str, Any] = {
        "swarm": swarm,
        "model": "tiny",
        "regime": run.regime,
        "seed": seed,
        "questions_per_round": run.questions_per_round,
        "completions_per_question": run.completions_per_question,
        "max_new_tokens": run.max_new_tokens,
        "trainer": TrainerConfig(lr=run.lr),
        "local": local,
        "external": external,
        "max_staleness_rounds": 0,
        "ledger_enabled": False,
    }
    return NodeSpec.build(**(settings | extra))


class Lockstep:
    """Nodes driven round by round (see the module docstring); ``nodes[i]`` is node i."""

    def __init__(self, nodes: list[RoundLoop], *, server_pid: int | None = None) -> None:
        self.nodes = nodes
        self.server_pid = server_pid
        """The nats-server's process id (``"nats"`` transport), None in memory."""
        self._distinct = [_count_distinct(node.collector) for node in nodes]

    async def share(self, i: int) -> SharedRound:
        """Node ``i`` generates, publishes and scores its groups of its current round."""
        return await self.nodes[i].share_round()

    async def train(self, i: int, shared: SharedRound) -> RoundReport:
        """Node ``i`` chooses, trains on and reports the round it shared."""
        return await self.nodes[i].train_round(shared)

    def distinct(self, i: int) -> int:
        """How many distinct messages node ``i``'s collector has seen (a redelivery of one
        it saw counts once)."""
        return len(self._distinct[i])

    async def wait_received(self, indices: Sequence[int], total: int) -> None:
        """Wait until the collector of every node in ``indices`` has seen ``total`` distinct
        messages (rejected ones and its own node's included).

        Distinct, not received: JetStream redelivers a message whose ack came late (seen on
        a loaded machine: 5 ``duplicate`` refusals in one SmolLM2 run), and a count that
        includes the redelivery ended the wait while a message was still in flight, so that
        node drew from a smaller pool and the run left its common random numbers (two runs
        of one seed parted at round 9 to 13). Polls: a collector has a waiter for
        admissions, not for messages seen, and a flood's messages are mostly refused. Works
        over either transport: both deliver every stored message to every consumer reading
        from the start.

        Raises:
            TimeoutError: some collector saw fewer within :data:`RECEIVE_TIMEOUT_S`.
        """
        with anyio.fail_after(RECEIVE_TIMEOUT_S):
            for i in indices:
                while self.distinct(i) < total:  # noqa: ASYNC110
                    await anyio.sleep(RECEIVE_POLL_S)


def _count_distinct(collector: Any) -> set[bytes]:
    """Wrap ``collector.ingest`` to remember a digest of every message it is given; the set
    it fills (what :meth:`Lockstep.distinct` counts)."""
    seen: set[bytes] = set()
    inner = collector.ingest

    def ingest(data: bytes, **kwargs: Any) -> Any:
        seen.add(hashlib.blake2b(data, digest_size=16).digest())
        return inner(data, **kwargs)

    collector.ingest = ingest
    return seen


@asynccontextmanager
async def lockstep(
    common: NodeSpec,
    nodes: int,
    *,
    key_label: str,
    spec_of: Callable[[int, NodeSpec], NodeSpec] | None = None,
    publisher_of: Callable[[int], PublisherFactory | None] | None = None,
    transport: TransportName = "memory",
) -> AsyncIterator[Lockstep]:
    """Assemble ``nodes`` nodes from ``common`` over one transport (see the module
    docstring), their collectors serving while the block runs.

    Node i is ``common`` with name ``node<i>``, task slot i, the key derived from
    ``f"{key_label}:{i}"``, reading the stream from its start; ``spec_of(i, spec)`` may
    change it further (its own model), ``publisher_of(i)`` give it another publisher (an
    attacker's; None: the product's). ``transport``: one of :data:`TRANSPORTS`.

    Raises:
        ConfigError: an invalid setting.
        TransportUnavailable: the nats-server did not start or cannot be reached.
    """
    from sapo_async.fabric.transport.embedded import EmbeddedNats

    if transport not in TRANSPORTS:
        raise ConfigError(
            f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}",
            field="transport",
        )
    async with AsyncExitStack() as stack:
        server: EmbeddedNats | None = None
        broker: MemoryBroker | None = None
        if transport == "nats":
            server = await stack.enter_async_context(EmbeddedNats())
        else:
            broker = MemoryBroker()
        loops: list[RoundLoop] = []
        # What the nodes open goes on the stack after the server (last in, first out: closed
        # before the server stops, even when assembly fails) and before the collectors.
        for i in range(nodes):
            account = Account.from_key(keccak256(f"{key_label}:{i}".encode()))
            where: dict[str, Any] = (
                {"transport": broker.connect(common.swarm)}
                if broker is not None
                else {"urls": (server.url,) if server is not None else ()}
            )
            spec = common.replace(
                name=f"node{i}", node_index=i, account=account, start="all", **where
            )
            if spec_of is not None:
                spec = spec_of(i, spec)
            publisher = (publisher_of(i) if publisher_of is not None else None) or Publisher
            parts = await assemble(complete_spec(spec), stack, publisher=publisher, offload=False)
            loops.append(parts.round_loop(offload=False))
        for loop in loops:
            await stack.enter_async_context(loop.collector)
        yield Lockstep(loops, server_pid=server.pid if server is not None else None)
