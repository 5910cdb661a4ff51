"""Backoff schedules: how long to wait before the next try. Pure: no clock, no sleep.

Owns the one doubling-and-capped schedule every retry in the project uses (publishing a
group, landing a commitment, joining NATS, waiting for a child server to answer). Callers
own the sleeping and the deadline, because each waits differently (an async sleep, a
condition with a timeout, a blocking poll of a child process).

Invariants: delays never decrease along a schedule, never exceed ``max_s``, and the first
is ``base_s``; :func:`delays` is finite exactly when ``attempts`` is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff", "retry_delay"]


def retry_delay(attempt: int, *, base_s: float, max_s: float, factor: float = 2.0) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (0-based).

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
    """A named schedule: ``base_s`` doubling (by ``factor``) up to ``max_s``.

    Attributes:
        base_s: the first delay.
        max_s: the largest delay.
        factor: growth per attempt.
    """

    base_s: float
    max_s: float
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        """The delay after failed attempt ``attempt`` (0-based); see :func:`retry_delay`."""
        return retry_delay(attempt, base_s=self.base_s, max_s=self.max_s, factor=self.factor)

    def delays(self, attempts: int | None = None) -> Iterator[float]:
        """The delays in order: ``attempts`` of them, or without end when None."""
        attempt = 0
        while attempts is None or attempt < attempts:
            yield self.delay(attempt)
            attempt += 1
