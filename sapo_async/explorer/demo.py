"""A short embedded swarm to explore: ``sapo-async explorer --demo``.

Owns running a few tiny-model nodes on the process's embedded NATS and EVM, writing their
JSONL round logs (the same lines ``sapo-async swarm`` writes), and serving the explorer
over them while they run and after. Each node lives in a task of its own (join, follow
its rounds into its log, wait for the end, leave), so a node can be added later from any
task (:meth:`DemoSwarm.add_node`: a late joiner, what the live view shows).

Deliberately small: the swarm's numbers come from :mod:`sapo_async.node`, the explorer's
from :mod:`.source`; this module only wires them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from sapo_async.errors import SapoError
from sapo_async.explorer.source import Explorer
from sapo_async.node.embedded import embedded_ledger
from sapo_async.node.lifecycle import Node
from sapo_async.node.spec import NodeSpec
from sapo_async.node.swarm import Swarm

__all__ = ["DemoSettings", "DemoSwarm", "demo_swarm", "serve_demo", "serve_embedded"]

RECORDER_IDLE_TIMEOUT_S = 60.0
"""A node's last commitments land within a second on the embedded chain; 60 s is a hang."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """The demo swarm's size (the defaults run ~30 s on two CPU cores)."""

    nodes: int = 3
    rounds: int = 20
    local: int = 2
    external: int = 2
    regime: str = "dense"
    seed: int = 0
    name: str = "explorer-demo"
    threads: int = 2


class DemoSwarm:
    """The running demo: its nodes, their logs, the ledger they commit to."""

    def __init__(self, settings: DemoSettings, log_dir: Path, tg: TaskGroup) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.nodes: list[Node] = []
        self._tg = tg
        self._closing = anyio.Event()
        self._settled: dict[str, anyio.Event] = {}
        self._common = NodeSpec.build(
            swarm=settings.name,
            regime=settings.regime,
            local=settings.local,
            external=settings.external,
            rounds=settings.rounds,
            seed=settings.seed,
            limiter=anyio.CapacityLimiter(settings.threads),
        )

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

    def explorer(self) -> Explorer:
        """An :class:`Explorer` over this swarm's ledger, logs and journals."""
        journal_dir = self.journal_dir
        return Explorer(
            self.ledger, chain="embedded", logs=self.log_dir, journals=lambda: [journal_dir]
        )

    async def add_node(self, rounds: int | None = None) -> Node:
        """Join one more node, running ``rounds`` rounds (default: the settings'); returns
        once it serves."""
        node: Node = await self._tg.start(self._run_node, len(self.nodes), rounds)
        return node

    async def wait_settled(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until every node joined so far finished its rounds and its last
        commitment landed.

        Raises:
            TimeoutError: not in time.
        """
        with anyio.fail_after(timeout):
            for event in list(self._settled.values()):
                await event.wait()

    async def _run_node(
        self, index: int, rounds: int | None, *, task_status: TaskStatus[Node]
    ) -> None:
        extra = {} if rounds is None else {"rounds": rounds}
        async with Swarm.join(self._common, name=f"node{index}", node_index=index, **extra) as node:
            self.nodes.append(node)
            settled = self._settled[node.address] = anyio.Event()
            task_status.started(node)
            with (self.log_dir / f"{node.name}.jsonl").open("w") as fh:
                async for report in node.rounds():
                    fh.write(json.dumps(report.as_dict()) + "\n")
                    fh.flush()
            if node.recorder is not None:
                await node.recorder.wait_idle(RECORDER_IDLE_TIMEOUT_S)
            settled.set()
            await self._closing.wait()  # stay joined: the ledger lives while a node does

    def _close(self) -> None:
        self._closing.set()
        for node in self.nodes:
            node.request_stop()


@contextlib.asynccontextmanager
async def demo_swarm(settings: DemoSettings, log_dir: Path) -> AsyncIterator[DemoSwarm]:
    """Run the demo swarm while the block runs (nodes leave at the end)."""
    log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before any node runs
    async with anyio.create_task_group() as tg:
        demo = DemoSwarm(settings, log_dir, tg)
        try:
            for _ in range(settings.nodes):
                await demo.add_node()
            yield demo
        finally:
            demo._close()


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
