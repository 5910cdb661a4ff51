"""Backoff schedules with jitter, and the one async retry helper every "try until it works" uses.

Owns the one doubling-and-capped schedule every retry in the project uses (publishing a
group, landing a commitment, joining NATS, subscribing, re-creating a consumer, waiting for
a child server to answer), its jitter, and :func:`retry_async`, the loop for the retries
that are "call, and on a transient error sleep and call again" (the publisher, the
collector's first subscription, joining NATS). Retries whose step between tries is not a
plain sleep take only the schedule: the recorder's sender (writes the journal and re-reads
what is pending between tries), the pull consumer's repair (sets a due time that its next
fetch checks) and a child's readiness poll (one generator shared by a blocking and an async
waiter).

Why jitter: without it a thousand nodes that lost the same server at the same instant
retry at the same instants, in lock-step, and hit it together when it returns. Each delay
is therefore stretched by a random factor in ``[1, 1 + jitter)``: never *shorter* than the
nominal schedule, so every window the limits name (``PUBLISH_RETRIES`` covering a server
restart, and so on) still holds, and spread by up to ``jitter`` of a delay per attempt, so
the nodes drift apart. Upward rather than AWS's "full jitter" (uniform in ``[0, d)``) for
that reason: full jitter can shorten a retry window to nearly nothing.

Why not a library: ``stamina`` and ``tenacity`` are well kept and installable, but both
own the loop, and three of our six retries are not loops of their own (see above); they
need only the schedule, which is twenty lines here. One helper plus one schedule here
serves all six without a dependency. Deterministic under test: every jittered call takes
an injectable :class:`random.Random`, :func:`retry_async` also a sleep and a clock.

Invariants: the nominal delays never decrease along a schedule, never exceed ``max_s``, and
the first is ``base_s``; a jittered delay lies in ``[nominal, nominal * (1 + jitter))``;
:meth:`Backoff.delays` is finite exactly when ``attempts`` is given; :func:`retry_async`
never sleeps past its deadline (it raises the last error instead).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import anyio

from sapo_async import limits

__all__ = ["NATS_JOIN_BACKOFF", "Backoff", "retry_async", "retry_delay"]

_T = TypeVar("_T")

_RNG = random.Random()  # spreading retries, not cryptography
"""The jitter source when a caller injects none."""


def retry_delay(attempt: int, *, base_s: float, max_s: float, factor: float = 2.0) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (0-based), without jitter.

    ``base_s * factor ** attempt``, capped at ``max_s``. The exponent is bounded so that a
    node retrying for days cannot overflow a float.

    Args:
        attempt: failures so far, minus one (0 after the first failure).
        base_s: the first delay.
        max_s: the largest delay.
        factor: growth per attempt (2 = doubling).

    Raises:
        ValueError: a negative attempt or delay, or a factor below 1.
    """
    if attempt < 0 or base_s < 0 or max_s < 0 or factor < 1:
        raise ValueError(
            f"need attempt >= 0, base_s >= 0, max_s >= 0, factor >= 1; "
            f"got {attempt}, {base_s}, {max_s}, {factor}"
        )
    return float(min(max_s, base_s * factor ** min(attempt, 64)))


@dataclass(frozen=True, slots=True)
class Backoff:
    """A named schedule: ``base_s`` doubling (by ``factor``) up to ``max_s``, with jitter.

    Attributes:
        base_s: the first nominal delay.
        max_s: the largest nominal delay.
        factor: growth per attempt.
        jitter: each delay is the nominal one times a random factor in ``[1, 1 + jitter)``;
            0 is the plain schedule.
    """

    base_s: float
    max_s: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"need 0 <= jitter <= 1, got {self.jitter}")

    def nominal(self, attempt: int) -> float:
        """The delay after failed attempt ``attempt`` without jitter; see :func:`retry_delay`."""
        return retry_delay(attempt, base_s=self.base_s, max_s=self.max_s, factor=self.factor)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay after failed attempt ``attempt`` (0-based), jittered.

        Args:
            attempt: failures so far, minus one.
            rng: the jitter source (a seeded one in tests); a module-wide one when None.
        """
        nominal = self.nominal(attempt)
        if self.jitter == 0.0:
            return nominal
        return nominal * (1.0 + self.jitter * (rng or _RNG).random())

    def delays(
        self, attempts: int | None = None, rng: random.Random | None = None
    ) -> Iterator[float]:
        """The delays in order: ``attempts`` of them, or without end when None."""
        attempt = 0
        while attempts is None or attempt < attempts:
            yield self.delay(attempt, rng)
            attempt += 1


NATS_JOIN_BACKOFF = Backoff(
    limits.NATS_JOIN_BACKOFF_BASE_S, limits.NATS_JOIN_BACKOFF_MAX_S, jitter=limits.RETRY_JITTER
)
"""How a joining node retries NATS, and its collector the first subscription: the same
schedule, so the collector waits for JetStream as long as the node waited for NATS."""


async def retry_async(
    fn: Callable[[], Awaitable[_T]],
    *,
    retry_on: tuple[type[Exception], ...],
    schedule: Backoff,
    attempts: int | None = None,
    timeout_s: float | None = None,
    give_up_on: tuple[type[Exception], ...] = (),
    on_retry: Callable[[int, Exception, float], None] | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
    clock: Callable[[], float] = anyio.current_time,
) -> _T:
    """Await ``fn()`` until it returns, sleeping on ``schedule`` after each transient error.

    Args:
        fn: one attempt.
        retry_on: the errors worth another try; anything else propagates at once.
        schedule: how long to wait after each failure.
        attempts: give up after this many tries (None: no limit but the deadline).
        timeout_s: give up rather than sleep past this many seconds after the first try
            (None: no deadline but ``attempts``).
        give_up_on: subclasses of ``retry_on`` that are final (a publish refused for good).
        on_retry: told ``(attempt, error, delay_s)`` before each sleep (1-based attempt
            that failed), to count and log.
        rng: the jitter source; see :meth:`Backoff.delay`.
        sleep: awaits a delay (a fake in tests).
        clock: seconds, for the deadline (a fake in tests).

    Returns:
        What the first successful attempt returned.

    Raises:
        Exception: the last attempt's error, once ``attempts`` are spent or the next sleep
        would end past the deadline; any error not in ``retry_on`` (or in ``give_up_on``)
        at once.
        ValueError: neither ``attempts`` nor ``timeout_s`` given, or ``attempts`` below 1.
    """
    if attempts is None and timeout_s is None:
        raise ValueError("retry_async needs attempts or timeout_s: a retry must end")
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    deadline = None if timeout_s is None else clock() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except give_up_on:
            raise
        except retry_on as exc:
            delay = schedule.delay(attempt - 1, rng)
            if attempts is not None and attempt >= attempts:
                raise
            if deadline is not None and clock() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            await sleep(delay)  # backoff: nothing to wait on but time
