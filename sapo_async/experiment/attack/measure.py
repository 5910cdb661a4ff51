"""How the attack experiment times a lockstep round: :class:`RoundClock`.

Owns the round's CPU measure. The flood and absurd attacks cost the *receivers*: every
honest collector verifies and refuses their messages in the run's one event loop, and it
does so while the attackers publish, not only afterwards. So the measure the summary uses is
the process's CPU over the whole round with nothing subtracted (``cpu_s``), against the
no-attack run with the same defences and seed, whose attackers' honest share and train
cost the same as the attackers' here. The older measure, the round without the attackers'
own share and train (``cpu_without_attackers_s``), is kept for comparison: it subtracts
the honest collectors' work done during the attackers' publish, so it undercounts a flood.

The nats-server is a separate process; its CPU over the round (``server_cpu_s``) is read
from ``/proc/<pid>/stat`` where there is one (Linux), else left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RoundClock", "RoundTimes", "process_cpu_s"]


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far (None: not readable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after its closing parenthesis
    # start at field 3, so utime and stime (fields 14 and 15) are at 11 and 12 there.
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class RoundTimes:
    """One round's times (see the module docstring).

    Attributes:
        cpu_s: the process's CPU seconds over the whole round.
        wall_s: wall seconds over the whole round (what sizes a matrix).
        cpu_without_attackers_s: the same less the attackers' own share and train.
        wall_without_attackers_s: wall seconds less the attackers' own share and train.
        server_cpu_s: the nats-server's CPU seconds over the round (None: none measured).
    """

    cpu_s: float
    wall_s: float
    cpu_without_attackers_s: float
    wall_without_attackers_s: float
    server_cpu_s: float | None


class RoundClock:
    """Times one round: :meth:`start`, :meth:`attacker` around each attacker step, :meth:`stop`.

    Args:
        cpu: the process's CPU clock.
        wall: a wall clock.
        server: the nats-server's CPU so far (None: no server, or not readable).
    """

    def __init__(
        self,
        *,
        cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.perf_counter,
        server: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._cpu, self._wall, self._server = cpu, wall, server
        self._c0 = self._w0 = 0.0
        self._s0: float | None = None
        self._attacker_cpu = self._attacker_wall = 0.0

    def start(self) -> None:
        """Start a round."""
        self._c0, self._w0, self._s0 = self._cpu(), self._wall(), self._server()
        self._attacker_cpu = self._attacker_wall = 0.0

    @contextmanager
    def attacker(self) -> Iterator[None]:
        """Count the block as an attacker's own step (subtracted by the old measure only)."""
        c0, w0 = self._cpu(), self._wall()
        try:
            yield
        finally:
            self._attacker_cpu += self._cpu() - c0
            self._attacker_wall += self._wall() - w0

    def stop(self) -> RoundTimes:
        """The round's times since :meth:`start`."""
        cpu, wall, server = self._cpu() - self._c0, self._wall() - self._w0, self._server()
        return RoundTimes(
            cpu_s=cpu,
            wall_s=wall,
            cpu_without_attackers_s=cpu - self._attacker_cpu,
            wall_without_attackers_s=wall - self._attacker_wall,
            server_cpu_s=None if server is None or self._s0 is None else server - self._s0,
        )
