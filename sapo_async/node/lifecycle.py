"""A running SAPO node: the round loop's life cycle, as an actor.

Owns starting and stopping one node. :class:`Node` is an
:class:`~sapo_async.actors.Actor`: it reports ready once its collector serves and its
recorder runs (both supervised in the node's task group), runs its
:class:`~sapo_async.node.rounds.RoundLoop` as its body, and stops by the actor protocol:

* drain (under ``spec.drain_timeout_s``): no new round starts, the round in progress
  finishes (or is abandoned when the deadline passes), then the collector stops and the
  recorder flushes its journal;
* teardown (shielded, under :data:`~sapo_async.limits.NODE_TEARDOWN_TIMEOUT_S`): a last
  checkpoint, then the resources handed over with :meth:`Node.add_cleanup` close, last in
  first out (journal, ledger, transport, the embedded server).

The round loop may end before the node stops (``training.rounds`` done, or
:meth:`Node.request_stop`): the collector and recorder keep serving until the node leaves,
so a caller can wait for commitments to land.

Deliberately does not know what a round does (:mod:`.rounds`) nor how the node's pieces
are built (:mod:`.swarm`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import anyio
from anyio.abc import TaskStatus

from sapo_async.actors import Actor, ActorState
from sapo_async.errors import ActorError, SapoError
from sapo_async.fabric.collector import Collector
from sapo_async.ledger.recorder import Recorder
from sapo_async.limits import NODE_TEARDOWN_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.node.learner import Learner
from sapo_async.node.report import NodeStats, RoundReport
from sapo_async.node.rounds import RoundLoop

__all__ = ["Node", "default_name"]


def default_name(address: str) -> str:
    """A node's name when its spec gives none: ``node-`` and six hex digits of its address."""
    return f"node-{address[2:8].lower()}"


class Node(Actor):
    """A running SAPO node (an async context manager; see the module docstring).

    Args:
        round_loop: the node's round loop over its pieces (built by
            :func:`~sapo_async.node.swarm.assemble`); its collector is not yet started
            (the node runs it).

    The round loop is public (:attr:`round_loop`: pause, resume, abandon the round,
    checkpoint, the publisher); the node itself offers only what a caller of
    :meth:`~sapo_async.node.swarm.Swarm.join` reads: who it is, its pieces, its reports.
    """

    def __init__(self, round_loop: RoundLoop) -> None:
        spec = round_loop.spec
        super().__init__(
            round_loop.name,
            drain_timeout=spec.drain_timeout_s,
            teardown_timeout=NODE_TEARDOWN_TIMEOUT_S,
        )
        self.spec = spec
        self.round_loop = round_loop
        self._cleanups = AsyncExitStack()
        self._release_recorder = anyio.Event()
        self._recorder_closed = anyio.Event()
        self._checkpointed_on_leaving = False
        self._log = get_logger("node", node=self.address, node_name=round_loop.name)

    # --- what the node is ----------------------------------------------------------------

    @property
    def address(self) -> str:
        """The node's Ethereum address (its identity everywhere)."""
        return self.round_loop.address

    @property
    def learner(self) -> Learner:
        """The node's model, tasks, generator, verifier and trainer."""
        return self.round_loop.learner

    @property
    def collector(self) -> Collector:
        """Admits other nodes' groups."""
        return self.round_loop.collector

    @property
    def recorder(self) -> Recorder | None:
        """Journals and lands round commitments (None: no ledger)."""
        return self.round_loop.recorder

    @property
    def round(self) -> int:
        """The next round this node will run."""
        return self.learner.round

    @property
    def reports(self) -> list[RoundReport]:
        """Reports kept so far (the most recent 10,000)."""
        return self.round_loop.history.reports

    def stats(self) -> NodeStats:
        """Totals published and consumed so far."""
        return self.round_loop.stats()

    def rounds(self) -> AsyncIterator[RoundReport]:
        """Yield a report per completed round, from the first one kept, until the rounds
        end.

        Raises:
            SapoError: the round loop failed (the original error is the cause).
        """
        return self.round_loop.history.follow()

    async def wait_rounds(self, count: int, *, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until this node has completed ``count`` rounds.

        Raises:
            TimeoutError: not in time.
            ActorStopped: the rounds ended first.
            SapoError: the round loop failed.
        """
        await self.round_loop.history.wait_count(count, timeout=timeout)

    def request_stop(self) -> None:
        """Ask the round loop to stop after the round in progress (non-blocking; safe from
        any task, e.g. a signal handler). :meth:`leave` still has to run."""
        self.round_loop.request_stop()

    # --- life cycle ----------------------------------------------------------------------

    def add_cleanup(self, resource: Any) -> None:
        """Close ``resource`` (an async context manager already entered, or anything with
        ``aclose``) when the node stops, after the node's own actors."""
        if isinstance(resource, AbstractAsyncContextManager):
            self._cleanups.push_async_exit(resource)
        else:
            self._cleanups.push_async_callback(resource.aclose)

    async def start(self) -> None:
        """Start the collector, the recorder and the round loop; returns once serving.

        Must be paired with :meth:`leave` in the same task (``async with`` does both).
        Idempotent.

        Raises:
            ActorFailed: the collector or recorder did not start.
        """
        if self.state is ActorState.CREATED:
            await self.__aenter__()

    async def leave(self) -> None:
        """Drain and stop (see the module docstring). Idempotent; the drain and the
        teardown are shielded from cancellation."""
        await self.__aexit__(None, None, None)

    async def _setup(self) -> None:
        tg = self._task_group
        if tg is None:  # pragma: no cover - run() sets it before calling us
            raise ActorError(f"node {self.name!r} set up outside its run()")
        if self.recorder is not None:
            await tg.start(self._hold_recorder, self.recorder)
        await tg.start(self.collector.run)
        training = self.spec.training
        self._log.info(
            "node_started", swarm=self.spec.swarm, local=training.local, external=training.external
        )

    async def _hold_recorder(
        self, recorder: Recorder, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # The recorder is a context manager with a task group of its own: it is entered
        # and exited in this one task so that its cancel scopes nest.
        try:
            async with recorder:
                task_status.started()
                await self._release_recorder.wait()
        finally:
            self._recorder_closed.set()

    async def _serve(self) -> None:
        await self.round_loop.run()
        await anyio.sleep_forever()  # collector and recorder serve until the node stops

    async def _drain(self) -> None:
        self.round_loop.request_stop()
        await self.round_loop.wait_done()
        await self.collector.stop()
        try:
            # The last checkpoint, so the commitments held for it reach the journal
            # before the recorder drains.
            await self._last_checkpoint()
        finally:
            self._release_recorder.set()
        if self.recorder is not None:
            await self._recorder_closed.wait()  # its journal flushed

    async def _last_checkpoint(self) -> None:
        """Checkpoint (and journal what it carries) once on the way out: in the drain, or
        in the teardown when the node stopped without one. A failure is logged (the error
        that stopped the node, if any, already reached the history's readers)."""
        if self._checkpointed_on_leaving:
            return
        self._checkpointed_on_leaving = True
        try:
            await self.round_loop.save_checkpoint()
        except SapoError as exc:
            self._log.error("checkpoint_failed", error=str(exc))

    async def _teardown(self) -> None:
        self.round_loop.history.close()
        try:
            await self._last_checkpoint()
        finally:
            try:
                await self._cleanups.aclose()  # journal, ledger, transport, embedded servers
            finally:
                stats = self.stats()
                self._log.info("node_left", rounds=stats.rounds, published=stats.published)
