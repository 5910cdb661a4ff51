"""A short embedded swarm to explore: ``sapo-async explorer --demo``.

Owns the demo's settings and serving the explorer over a few tiny-model nodes on the
process's embedded NATS and EVM while they run and after. Running them (each in a task of
its own, its JSONL round log the same lines ``sapo-async swarm`` writes) is
:func:`~sapo_async.node.runner.run_swarm`'s, so a node can be added later from any task
(:meth:`DemoSwarm.add_node`: a late joiner, what the live view shows).

Deliberately small: the swarm's numbers come from :mod:`sapo_async.node`, the explorer's
from :mod:`.source`; this module only wires them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from sapo_async.errors import SapoError
from sapo_async.explorer.source import Explorer
from sapo_async.explorer.views import LiveBacklog
from sapo_async.limits import REAL_MODEL_SIZES
from sapo_async.node.embedded import embedded_ledger
from sapo_async.node.lifecycle import Node
from sapo_async.node.runner import SwarmRun, run_swarm
from sapo_async.node.spec import NodeSpec

__all__ = ["DemoSettings", "DemoSwarm", "demo_swarm", "serve_demo", "serve_embedded"]


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """The demo swarm's size (the defaults run ~30 s on two CPU cores)."""

    nodes: int = 3
    rounds: int = 20
    local: int = 2
    external: int = 2
    regime: str = "dense"
    model: str = "tiny"
    seed: int = 0
    name: str = "explorer-demo"
    threads: int = 2


class DemoSwarm:
    """The running demo: its nodes, their logs, the ledger they commit to."""

    def __init__(
        self, settings: DemoSettings, log_dir: Path, common: NodeSpec, run: SwarmRun
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self._common = common  # one limiter for every node, late joiners too
        self._run = run

    @property
    def nodes(self) -> list[Node]:
        """The nodes joined so far, in the order they joined."""
        return self._run.nodes

    @property
    def ledger(self) -> Any:
        """The swarm's ledger client (an :class:`~sapo_async.ledger.EvmLedger`).

        Raises:
            SapoError: no node holds the embedded ledger (before the first join).
        """
        handle = embedded_ledger(self.settings.name)
        if handle is None:
            raise SapoError(f"the demo swarm {self.settings.name!r} has no ledger yet")
        return handle.ledger

    @property
    def journal_dir(self) -> Path:
        """Where the nodes' journals are (for inclusion checks)."""
        handle = embedded_ledger(self.settings.name)
        if handle is None:
            raise SapoError(f"the demo swarm {self.settings.name!r} has no ledger yet")
        return handle.journal_dir

    def backlogs(self) -> dict[str, LiveBacklog]:
        """Each node's commitment backlog now, as its own rounds see it."""
        out = {}
        for node in self.nodes:
            pacing = node.round_loop.pacing
            recorder = node.recorder
            out[node.address] = LiveBacklog(
                pending=0 if recorder is None else recorder.statistics().pending,
                paused=pacing.backlog_paused,
                max_pending=pacing.max_pending,
            )
        return out

    def explorer(self) -> Explorer:
        """An :class:`Explorer` over this swarm's ledger, logs, journals and nodes."""
        journal_dir = self.journal_dir
        return Explorer(
            self.ledger,
            chain="embedded",
            logs=self.log_dir,
            journals=lambda: [journal_dir],
            live=self.backlogs,
        )

    async def add_node(self, rounds: int | None = None) -> Node:
        """Join one more node, running ``rounds`` rounds (default: the settings'); returns
        once it serves."""
        extra = {} if rounds is None else {"rounds": rounds}
        index = len(self.nodes)
        return await self._run.add_node(
            self._common.replace(name=f"node{index}", node_index=index, **extra)
        )

    async def wait_settled(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until every node joined so far finished its rounds and its last
        commitment landed.

        Raises:
            TimeoutError: not in time.
        """
        await self._run.wait_settled(timeout)


@contextlib.asynccontextmanager
async def demo_swarm(settings: DemoSettings, log_dir: Path) -> AsyncIterator[DemoSwarm]:
    """Run the demo swarm while the block runs (nodes leave at the end)."""
    sizes = {} if settings.model == "tiny" else REAL_MODEL_SIZES
    common = NodeSpec.build(
        swarm=settings.name,
        regime=settings.regime,
        model=settings.model,
        **sizes,
        local=settings.local,
        external=settings.external,
        rounds=settings.rounds,
        seed=settings.seed,
        limiter=anyio.CapacityLimiter(settings.threads),
    )
    specs = [common.replace(name=f"node{i}", node_index=i) for i in range(settings.nodes)]
    async with run_swarm(specs, log_dir=log_dir) as run:
        yield DemoSwarm(settings, log_dir, common, run)


@contextlib.asynccontextmanager
async def serve_demo(
    settings: DemoSettings, log_dir: Path, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[tuple[DemoSwarm, str]]:
    """Run the demo swarm and serve the explorer over it; yields (swarm, URL)."""
    from sapo_async.explorer.app import build_app
    from sapo_async.explorer.server import serving

    async with (
        demo_swarm(settings, log_dir) as demo,
        serving(build_app(demo.explorer()), host=host, port=port) as url,
    ):
        yield demo, url


@contextlib.asynccontextmanager
async def serve_embedded(
    swarm: str, log_dir: Path, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve the explorer over the embedded swarm ``swarm`` of this process (``sapo-async
    swarm --explorer``); yields the URL.

    Raises:
        SapoError: no node of this process holds ``swarm``'s embedded ledger.
    """
    from sapo_async.explorer.app import build_app
    from sapo_async.explorer.server import serving

    handle = embedded_ledger(swarm)
    if handle is None:
        raise SapoError(f"swarm {swarm!r} has no embedded ledger to explore (run with --ledger)")
    journal_dir = handle.journal_dir
    explorer = Explorer(
        handle.ledger, chain="embedded", logs=log_dir, journals=lambda: [journal_dir]
    )
    async with serving(build_app(explorer), host=host, port=port) as url:
        yield url
