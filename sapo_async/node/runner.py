"""Running a swarm of this process's nodes: the one runner of ``sapo-async swarm``, the
explorer's demo and the async paper table.

Owns a swarm's run, not its nodes: each node lives in a task of its own (join, stream its
:class:`~sapo_async.node.report.RoundReport` s into ``<log_dir>/<name>.jsonl``, one
``as_dict()`` line per round, wait for its last commitments to land, stay joined until the
block ends, leave), so a node can be added later from any task (:meth:`SwarmRun.add_node`).
Assembling a node is :mod:`.swarm`'s; what the reports mean is the caller's.

Invariants: a node is started and left in the same task (what :meth:`Swarm.join
<sapo_async.node.swarm.Swarm.join>` asks); once :meth:`SwarmRun.wait_settled` returns,
every node joined so far finished its rounds and nothing of its journal is pending (and the
nodes still joined settled the credit claims their peers' last rounds made settleable); leaving
the block stops every node's rounds after the round in progress, and a node that failed
fails the block (no wait hangs on it).

Usage::

    async with run_swarm(specs, log_dir=Path("runs/swarm")) as run:
        await run.wait_settled(timeout=600)
        ...  # the nodes are still joined: the embedded ledger is there to audit
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio
from anyio.abc import TaskGroup, TaskStatus

from sapo_async.actors import ActorState
from sapo_async.errors import ActorStopped
from sapo_async.limits import SWARM_LAND_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.node.lifecycle import Node
from sapo_async.node.report import RoundReport
from sapo_async.node.spec import NodeSpec
from sapo_async.node.swarm import Swarm

_log = get_logger("runner")

__all__ = ["OnReport", "OnSettled", "SwarmRun", "run_swarm"]

OnReport = Callable[[Node, RoundReport], None]
"""Called in the node's task with each of its reports (after its log line is written)."""

OnSettled = Callable[[Node], None]
"""Called in the node's task once its rounds ended and its commitments landed, while it is
still joined (its recorder's and collector's statistics are final and readable)."""


class SwarmRun:
    """A running swarm: its nodes, in the order they were added, and their logs.

    Built by :func:`run_swarm`; see the module docstring.
    """

    def __init__(
        self,
        tg: TaskGroup,
        *,
        log_dir: Path | None,
        on_report: OnReport | None,
        on_settled: OnSettled | None,
        land_timeout_s: float,
        leave_when_settled: bool,
    ) -> None:
        self.log_dir = log_dir
        self._tg = tg
        self._on_report = on_report
        self._on_settled = on_settled
        self._land_timeout_s = land_timeout_s
        self._leave_when_settled = leave_when_settled
        self._members: dict[int, Node] = {}
        self._settled: list[anyio.Event] = []
        self._closing = anyio.Event()
        self._added = 0

    @property
    def nodes(self) -> list[Node]:
        """The nodes joined so far (those that left too), in the order they were added."""
        return [self._members[i] for i in sorted(self._members)]

    async def add_node(self, spec: NodeSpec) -> Node:
        """Join one more node as ``spec`` says; returns once it serves.

        Raises:
            ConfigError: an invalid setting.
            TransportUnavailable: NATS stayed unreachable.
        """
        index = self._added
        self._added += 1
        settled = anyio.Event()
        self._settled.append(settled)
        node: Node = await self._tg.start(self._run_node, index, spec, settled)
        return node

    async def wait_settled(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until every node joined so far finished its rounds and its last commitment
        landed (``timeout``: ``math.inf`` for as long as the rounds take).

        Raises:
            TimeoutError: not in time.
        """
        with anyio.fail_after(None if math.isinf(timeout) else timeout):
            for event in list(self._settled):
                await event.wait()
        if not self._leave_when_settled:
            # Nodes that leave once settled are closing their journals now: each settled
            # what it could before it left (_run_node); the rest stays open on chain.
            await self._settle_credit()

    async def _settle_credit(self) -> None:
        """Let every joined node settle its credit claims on peers' rounds that landed after
        its own last one (every node's rounds are on chain now), so an audit read next sees
        the credit. Best effort: a claim left open stays on chain for anyone to settle."""
        for node in self.nodes:
            recorder = node.recorder
            if recorder is None or recorder.state is not ActorState.RUNNING:
                continue
            try:
                await recorder.wait_credit_settled(self._land_timeout_s)
            except (TimeoutError, ActorStopped):
                _log.info(
                    "credit_claims_left_open",
                    node=node.address,
                    open=recorder.statistics().claims_open,
                )

    def close(self) -> None:
        """Stop every node's rounds after the round in progress; the nodes then land their
        commitments and leave (non-blocking, idempotent)."""
        self._closing.set()
        for node in self._members.values():
            node.request_stop()

    async def _run_node(
        self, index: int, spec: NodeSpec, settled: anyio.Event, *, task_status: TaskStatus[Node]
    ) -> None:
        async with Swarm.join(spec) as node:
            self._members[index] = node
            if self._closing.is_set():
                node.request_stop()
            task_status.started(node)
            await self._follow(node)
            if node.recorder is not None:
                try:
                    await node.recorder.wait_idle(self._land_timeout_s)
                except TimeoutError:
                    # Nothing is lost: what did not land stays journaled and lands when the
                    # node next runs. The caller reads the counts (pending) as they are.
                    _log.warning(
                        "commitments_still_pending",
                        node=node.address,
                        pending=node.recorder.statistics().pending,
                        waited_s=self._land_timeout_s,
                    )
            if self._leave_when_settled and node.recorder is not None:
                # Best effort: an open claim stays on chain for anyone to settle.
                with contextlib.suppress(TimeoutError, ActorStopped):
                    await node.recorder.wait_credit_settled(self._land_timeout_s)
            if self._on_settled is not None:
                self._on_settled(node)
            settled.set()
            if not self._leave_when_settled:
                await self._closing.wait()  # stay joined: the ledger lives while a node does

    async def _follow(self, node: Node) -> None:
        """Stream the node's reports to its log and the caller until its rounds end."""
        if self.log_dir is None:
            async for report in node.rounds():
                if self._on_report is not None:
                    self._on_report(node, report)
            return
        with (self.log_dir / f"{node.name}.jsonl").open("w") as fh:
            async for report in node.rounds():
                fh.write(json.dumps(report.as_dict()) + "\n")
                fh.flush()
                if self._on_report is not None:
                    self._on_report(node, report)


@contextlib.asynccontextmanager
async def run_swarm(
    specs: Sequence[NodeSpec],
    *,
    log_dir: Path | None,
    on_report: OnReport | None = None,
    on_settled: OnSettled | None = None,
    land_timeout_s: float = SWARM_LAND_TIMEOUT_S,
    join_at_once: bool = False,
    leave_when_settled: bool = False,
) -> AsyncIterator[SwarmRun]:
    """Join a node per spec and run them while the block runs; every node leaves at the end.

    Args:
        specs: one per node (each named: its name is its log's).
        log_dir: where ``<name>.jsonl`` round logs go (created); None: no logs.
        on_report: see :data:`OnReport`.
        on_settled: see :data:`OnSettled`.
        land_timeout_s: how long to wait for a node's last commitments to land; what is still
            pending then stays journaled (it lands when the node next runs), is logged as
            ``commitments_still_pending`` and the run goes on.
        join_at_once: join every node concurrently (the models must be loaded already:
            transformers' loading is not thread-safe); default: one after another.
        leave_when_settled: a node leaves as soon as it settled instead of at the block's
            end (so a finished node takes no CPU from the others' rounds).

    Yields:
        The :class:`SwarmRun`, once every node serves.

    Raises:
        ConfigError: an invalid setting.
        TransportUnavailable: NATS stayed unreachable.
        SapoError: a node's round loop failed.
    """
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before any node runs
    async with anyio.create_task_group() as tg:
        run = SwarmRun(
            tg,
            log_dir=log_dir,
            on_report=on_report,
            on_settled=on_settled,
            land_timeout_s=land_timeout_s,
            leave_when_settled=leave_when_settled,
        )
        try:
            if join_at_once:
                async with anyio.create_task_group() as joins:
                    for spec in specs:
                        joins.start_soon(run.add_node, spec)
            else:
                for spec in specs:
                    await run.add_node(spec)
            yield run
        finally:
            run.close()
