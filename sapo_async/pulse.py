"""A pulse: wake every task waiting now, without a lock, from synchronous code.

Owns the one "something changed, look again" signal the node's pieces share: a collector
that admitted a group, a recorder that settled a commitment, an in-memory stream that stored
a message, a round history that gained a report. Deliberately does not know what changed: a
waiter re-checks its own condition after every wake, in a loop, and bounds the loop with a
timeout (STYLE.md: every wait has a timeout)::

    with anyio.fail_after(timeout):
        while not done():
            await pulse.wait()

Why not anyio's primitives: an :class:`anyio.Event` is one-shot (once set it stays set, so
each wake needs a fresh one: the "set, then replace" dance this class names once), and
:meth:`anyio.Condition.notify_all` needs the condition's lock held, which the synchronous
code that fires (``Collector.ingest``, ``RoundHistory.add``) cannot take, and which every
waiter would then retake on waking only to release it at once.

Guarantees:
    * :meth:`Pulse.fire` wakes every task whose :meth:`Pulse.wait` began before it, once;
    * a wait that begins after a fire waits for the next fire: a fire with nobody waiting is
      not remembered (a pulse is not a latch; a flag that must survive until its one
      consumer looks is an Event replaced by that consumer, as the recorder's sender wake);
    * no wake-up is lost in the loop above: ``wait()`` picks the fire it waits for before its
      first checkpoint, so no fire comes between the caller's ``done()`` and the wait;
    * ``fire()`` never blocks and never raises; a cancelled waiter leaves nothing behind.

Edge cases: several fires before a woken task runs again wake it once (it re-checks, and
sees everything they announced). ``fire()`` belongs to the event loop's thread, like every
anyio primitive; a worker thread fires through ``anyio.from_thread.run_sync(pulse.fire)``.
"""

from __future__ import annotations

import anyio

__all__ = ["Pulse"]


class Pulse:
    """Wakes every task waiting now; a task that waits later waits for the next fire."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def fire(self) -> None:
        """Wake every task waiting now (non-blocking; nothing happens if none waits)."""
        event, self._event = self._event, anyio.Event()
        event.set()

    async def wait(self) -> None:
        """Wait for the next :meth:`fire`.

        Bound it with a timeout (``anyio.fail_after``) and re-check the condition after it
        returns: a wake says only that something changed.
        """
        await self._event.wait()
