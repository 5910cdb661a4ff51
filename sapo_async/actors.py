"""A small actor runtime on anyio.

Owns the life cycle every long-running piece of a node shares: a state machine, a readiness
handshake, supervision inside a task group, and graceful drain.

An actor subclass overrides some of four hooks:

* ``_setup()``: acquire resources; the actor reports ready only after it returns;
* ``_serve()``: an optional long-running body (e.g. a consumer loop); cancelled at stop;
* ``_drain()``: flush in-flight work once asked to stop (publishers flush here);
* ``_teardown()``: release resources; always runs, shielded from cancellation.

Deliberately does not know what an actor does, nor anything about NATS or models. There is
no mailbox: the node's actors (collector, recorder, node) take work through their own
methods (a subscription, the journal, the round loop), and each raises
:class:`ActorStopped` to a caller that asks a stopped one for work.

Invariants:
    * states move only forward: created -> starting -> running -> draining -> stopped, or
      to failed from any live state;
    * ``stop()`` is idempotent and finishes within the drain deadline plus teardown, even
      when the caller is being cancelled (the drain is shielded);
    * waiting on an actor that was never started raises :class:`ActorStopped`, never hangs;
    * a hook that raises makes the actor ``failed`` and surfaces as :class:`ActorFailed`
      (with the original error as ``__cause__``) in the supervising task group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

from sapo_async.errors import ActorError, ActorFailed, ActorStopped
from sapo_async.limits import ACTOR_DRAIN_TIMEOUT_S, ACTOR_START_TIMEOUT_S
from sapo_async.logs import get_logger

__all__ = ["Actor", "ActorState", "ActorStatistics"]


class ActorState(enum.Enum):
    """Where an actor is in its life."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    """A snapshot of an actor.

    Attributes:
        name: the actor's name.
        state: its current state.
    """

    name: str
    state: ActorState


class Actor:
    """Base class of every actor. Use as an async context manager or start in a task group.

    ``async with actor:`` starts it in a private task group and stops it on exit;
    ``await task_group.start(actor.run)`` starts it under a supervising task group, where a
    failure surfaces as :class:`ActorFailed`.

    Args:
        name: shown in logs, errors and statistics.
        drain_timeout: seconds ``stop()`` lets in-flight work finish before cancelling it.
        start_timeout: seconds ``_setup()`` may take.
        teardown_timeout: seconds ``_teardown()`` may take (default: ``drain_timeout``).
    """

    def __init__(
        self,
        name: str,
        *,
        drain_timeout: float = ACTOR_DRAIN_TIMEOUT_S,
        start_timeout: float = ACTOR_START_TIMEOUT_S,
        teardown_timeout: float | None = None,
    ) -> None:
        teardown_timeout = drain_timeout if teardown_timeout is None else teardown_timeout
        if min(drain_timeout, start_timeout, teardown_timeout) <= 0:
            raise ValueError("timeouts must be > 0")
        self.name = name
        self._state = ActorState.CREATED
        self._drain_timeout = drain_timeout
        self._start_timeout = start_timeout
        self._teardown_timeout = teardown_timeout
        self._stop_requested = anyio.Event()
        self._finished = anyio.Event()
        self._failure: BaseException | None = None
        self._own_tg: TaskGroup | None = None
        # The task group of run(), while it runs: hooks start supervised children in it
        # (``await self._task_group.start(child.run)`` from ``_setup``).
        self._task_group: TaskGroup | None = None
        self._log = get_logger("actor", actor=name)

    # --- hooks ---------------------------------------------------------------------

    async def _setup(self) -> None:
        """Acquire resources before the actor reports ready."""

    async def _serve(self) -> None:
        """Long-running body; by default nothing (the actor serves until stopped)."""
        await anyio.sleep_forever()

    async def _drain(self) -> None:
        """Flush in-flight work once asked to stop (``_serve()`` still runs meanwhile)."""

    async def _teardown(self) -> None:
        """Release resources (runs shielded, in every outcome)."""

    # --- public --------------------------------------------------------------------

    @property
    def state(self) -> ActorState:
        """The current state."""
        return self._state

    def statistics(self) -> ActorStatistics:
        """Return a snapshot of this actor."""
        return ActorStatistics(name=self.name, state=self._state)

    async def wait_stopped(self) -> None:
        """Wait until the actor is stopped or failed (at most drain + teardown + start
        timeouts).

        Raises:
            ActorStopped: the actor was never started (nothing would ever stop it).
            TimeoutError: it did not stop in time.
        """
        if self._state is ActorState.CREATED:
            raise ActorStopped(self.name, self._state.value)
        with anyio.fail_after(self._drain_timeout + self._teardown_timeout + self._start_timeout):
            await self._finished.wait()

    async def stop(self) -> None:
        """Drain and stop; idempotent, returns once the actor is stopped or failed.

        ``_drain()`` runs under the drain deadline; whatever is left is then cancelled and
        ``_teardown()`` runs.
        The wait is shielded, so a cancelled caller still leaves a stopped actor behind.
        From inside the actor's own hooks use :meth:`stop_nowait` (awaiting ``stop()`` there
        would wait for itself).
        """
        if self._state is ActorState.CREATED:
            self._state = ActorState.STOPPED
            self._finished.set()
            return
        self._stop_requested.set()
        with anyio.CancelScope(shield=True):
            await self.wait_stopped()

    def stop_nowait(self) -> None:
        """Ask the actor to drain and stop, without waiting (safe from its own hooks)."""
        self._stop_requested.set()

    async def run(self, *, task_status: TaskStatus[Self] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the actor until stopped; use with ``task_group.start(actor.run)``.

        Reports ready (``task_status.started(self)``) once ``_setup()`` returned and the
        ``_serve()`` task is running.

        Raises:
            ActorError: the actor was already started.
            ActorFailed: a hook raised (the original error is ``__cause__``).
        """
        if self._state is not ActorState.CREATED:
            raise ActorError(f"actor {self.name!r} was already started ({self._state.value})")
        self._state = ActorState.STARTING
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                with anyio.fail_after(self._start_timeout):
                    await self._setup()
                tg.start_soon(self._serve)
                self._state = ActorState.RUNNING
                self._log.debug("actor_started")
                task_status.started(self)
                await self._stop_requested.wait()
                self._state = ActorState.DRAINING
                with anyio.move_on_after(self._drain_timeout, shield=True) as scope:
                    await self._drain()
                if scope.cancelled_caught:
                    self._log.warning("actor_drain_timed_out", timeout_s=self._drain_timeout)
                tg.cancel_scope.cancel()
        except Exception as exc:
            self._state = ActorState.FAILED
            self._failure = exc
            cause = _unwrap(exc)
            self._log.error("actor_failed", error=repr(cause))
            raise ActorFailed(self.name, repr(cause)) from cause
        finally:
            self._task_group = None
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self._teardown_timeout):
                    await self._teardown()
            finally:  # a teardown that raised must not leave stop() waiting
                if self._state is not ActorState.FAILED:
                    self._state = ActorState.STOPPED
                    self._log.debug("actor_stopped")
                self._finished.set()

    async def __aenter__(self) -> Self:
        self._own_tg = anyio.create_task_group()
        await self._own_tg.__aenter__()
        try:
            await self._own_tg.start(self.run)
        except BaseException as exc:
            await self._own_tg.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg, self._own_tg = self._own_tg, None
        if tg is None:
            return None
        try:
            await self.stop()
        finally:
            suppress = await tg.__aexit__(exc_type, exc, tb)
        return suppress


def _unwrap(exc: BaseException) -> BaseException:
    """The single leaf of nested exception groups, or the group itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
