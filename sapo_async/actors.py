"""A small actor runtime on anyio.

Owns the life cycle every long-running piece of a node shares: a state machine, a bounded
mailbox, a readiness handshake, supervision inside a task group, and graceful drain.

An actor subclass overrides some of four hooks:

* ``_setup()``: acquire resources; the actor reports ready only after it returns;
* ``_serve()``: an optional long-running body (e.g. a consumer loop); cancelled at stop;
* ``_handle(message)``: called for each mailbox message, one at a time, in order;
* ``_drain()``: flush in-flight work after intake stopped (publishers flush here);
* ``_teardown()``: release resources; always runs, shielded from cancellation.

Deliberately does not know what the messages mean, nor anything about NATS or models.

Invariants:
    * states move only forward: created -> starting -> running -> draining -> stopped, or
      to failed from any live state;
    * ``stop()`` is idempotent and finishes within the drain deadline plus teardown, even
      when the caller is being cancelled (the drain is shielded);
    * asking a stopped (or draining) actor for work raises :class:`ActorStopped`; a sender
      blocked on a full mailbox when the actor stops gets :class:`ActorStopped`, never a hang;
    * a hook that raises makes the actor ``failed`` and surfaces as :class:`ActorFailed`
      (with the original error as ``__cause__``) in the supervising task group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Self, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sapo_async.errors import ActorError, ActorFailed, ActorStopped
from sapo_async.limits import ACTOR_DRAIN_TIMEOUT_S, ACTOR_START_TIMEOUT_S, DEFAULT_MAILBOX_SIZE
from sapo_async.logs import get_logger

__all__ = ["Actor", "ActorState", "ActorStatistics", "MailboxStatistics"]

MsgT = TypeVar("MsgT")


class ActorState(enum.Enum):
    """Where an actor is in its life."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class MailboxStatistics:
    """A snapshot of a mailbox.

    Attributes:
        size: messages waiting in the buffer.
        capacity: buffer bound (senders block beyond it).
        senders_waiting: senders blocked on a full buffer (backpressure in action).
    """

    size: int
    capacity: int
    senders_waiting: int


@dataclass(frozen=True, slots=True)
class ActorStatistics:
    """A snapshot of an actor.

    Attributes:
        name: the actor's name.
        state: its current state.
        handled: mailbox messages handled so far.
        mailbox: its mailbox's statistics.
    """

    name: str
    state: ActorState
    handled: int
    mailbox: MailboxStatistics


class Actor(Generic[MsgT]):
    """Base class of every actor. Use as an async context manager or start in a task group.

    ``async with actor:`` starts it in a private task group and stops it on exit;
    ``await task_group.start(actor.run)`` starts it under a supervising task group, where a
    failure surfaces as :class:`ActorFailed`.

    Args:
        name: shown in logs, errors and statistics.
        mailbox_size: bound of the mailbox (0 means senders wait for the actor to take each
            message: a rendezvous).
        drain_timeout: seconds ``stop()`` lets in-flight work finish before cancelling it.
        start_timeout: seconds ``_setup()`` may take.
        teardown_timeout: seconds ``_teardown()`` may take (default: ``drain_timeout``).
    """

    def __init__(
        self,
        name: str,
        *,
        mailbox_size: int = DEFAULT_MAILBOX_SIZE,
        drain_timeout: float = ACTOR_DRAIN_TIMEOUT_S,
        start_timeout: float = ACTOR_START_TIMEOUT_S,
        teardown_timeout: float | None = None,
    ) -> None:
        teardown_timeout = drain_timeout if teardown_timeout is None else teardown_timeout
        if mailbox_size < 0 or min(drain_timeout, start_timeout, teardown_timeout) <= 0:
            raise ValueError("mailbox_size must be >= 0 and timeouts must be > 0")
        self.name = name
        self._state = ActorState.CREATED
        self._drain_timeout = drain_timeout
        self._start_timeout = start_timeout
        self._teardown_timeout = teardown_timeout
        self._capacity = mailbox_size
        # Streams are made in run(): an actor that never starts holds nothing to close.
        self._mailbox_send: MemoryObjectSendStream[MsgT] | None = None
        self._mailbox_receive: MemoryObjectReceiveStream[MsgT] | None = None
        self._handled = 0
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
        """Long-running body; by default nothing (the mailbox loop runs anyway)."""
        await anyio.sleep_forever()

    async def _handle(self, message: MsgT) -> None:
        """Handle one mailbox message."""
        raise ActorError(f"actor {self.name!r} does not accept messages")

    async def _drain(self) -> None:
        """Flush in-flight work after the mailbox emptied."""

    async def _teardown(self) -> None:
        """Release resources (runs shielded, in every outcome)."""

    # --- public --------------------------------------------------------------------

    @property
    def state(self) -> ActorState:
        """The current state."""
        return self._state

    def statistics(self) -> ActorStatistics:
        """Return a snapshot of this actor and its mailbox."""
        size = waiting = 0
        if self._mailbox_send is not None:
            stats = self._mailbox_send.statistics()
            size, waiting = stats.current_buffer_used, stats.tasks_waiting_send
        return ActorStatistics(
            name=self.name,
            state=self._state,
            handled=self._handled,
            mailbox=MailboxStatistics(size=size, capacity=self._capacity, senders_waiting=waiting),
        )

    async def send(self, message: MsgT) -> None:
        """Put ``message`` in the mailbox, waiting while it is full (backpressure).

        Raises:
            ActorStopped: the actor is not running, or stopped while we waited.
        """
        send = self._check_accepting()
        try:
            await send.send(message)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ActorStopped(self.name, self._state.value) from exc

    def send_nowait(self, message: MsgT) -> None:
        """Put ``message`` in the mailbox without waiting.

        Raises:
            ActorStopped: the actor is not running.
            anyio.WouldBlock: the mailbox is full.
        """
        send = self._check_accepting()
        try:
            send.send_nowait(message)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ActorStopped(self.name, self._state.value) from exc

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

        In-flight and queued mailbox messages are handled, then ``_drain()`` runs, all under
        the drain deadline; whatever is left is then cancelled and ``_teardown()`` runs.
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
        mailbox and ``_serve()`` tasks are running.

        Raises:
            ActorError: the actor was already started.
            ActorFailed: a hook raised (the original error is ``__cause__``).
        """
        if self._state is not ActorState.CREATED:
            raise ActorError(f"actor {self.name!r} was already started ({self._state.value})")
        self._state = ActorState.STARTING
        send, receive = anyio.create_memory_object_stream[MsgT](self._capacity)
        self._mailbox_send, self._mailbox_receive = send, receive
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                with anyio.fail_after(self._start_timeout):
                    await self._setup()
                mailbox_done = anyio.Event()
                tg.start_soon(self._mailbox_loop, receive, mailbox_done)
                tg.start_soon(self._serve)
                self._state = ActorState.RUNNING
                self._log.debug("actor_started")
                task_status.started(self)
                await self._stop_requested.wait()
                self._state = ActorState.DRAINING
                with anyio.move_on_after(self._drain_timeout, shield=True) as scope:
                    send.close()
                    await mailbox_done.wait()
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
            send.close()
            receive.close()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._teardown_timeout):
                await self._teardown()
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

    # --- internals -----------------------------------------------------------------

    def _check_accepting(self) -> MemoryObjectSendStream[MsgT]:
        send = self._mailbox_send
        if send is None or self._state not in (ActorState.STARTING, ActorState.RUNNING):
            raise ActorStopped(self.name, self._state.value)
        return send

    async def _mailbox_loop(
        self, receive: MemoryObjectReceiveStream[MsgT], done: anyio.Event
    ) -> None:
        try:
            async for message in receive:
                await self._handle(message)
                self._handled += 1
        finally:
            done.set()


def _unwrap(exc: BaseException) -> BaseException:
    """The single leaf of nested exception groups, or the group itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
