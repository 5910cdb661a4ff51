"""How the attack experiment times a lockstep round: :class:`RoundClock`.

Owns the round's CPU measure. The flood and absurd attacks cost the *receivers*: every
honest collector verifies and refuses their messages in the run's one event loop, and it
does so while the attackers publish, not only afterwards. So the measure the summary uses is
the process's CPU over the whole round with nothing subtracted (``cpu_s``), against the
no-attack run with the same defences and seed, whose attackers' honest share and train
cost the same as the attackers' here. The older measure, the round without the attackers'
own share and train (``cpu_without_attackers_s``), is kept for comparison: it subtracts
the honest collectors' work done during the attackers' publish, so it undercounts a flood.

In one process the attackers' own work (forging and signing copies, publishing) is counted
in ``cpu_s`` too, which a real swarm would not charge to an honest node: over the in-memory
transport, where a round is a fraction of a second, the tiny model's flood measured 3.7x
that way. ``cpu_honest_s`` is the round less the attackers' own steps, with the honest
collectors' ingest during those steps added back and the attackers' collectors' ingest
outside them taken out (:meth:`RoundClock.collector`): what the honest nodes themselves
spent.

The nats-server is a separate process; its CPU over the round (``server_cpu_s``) is read
from ``/proc/<pid>/stat`` where there is one (Linux), else left out.

The summary's CPU ratios of a recorded run to its no-attack run (:func:`cost_ratios`,
:func:`round_cpu`) are here too: the measures above, read back.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sapo_async.experiment.attack.spec import RunMeasure

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "COST_METRICS",
    "RoundClock",
    "RoundTimes",
    "cost_ratios",
    "process_cpu_s",
    "ratio",
    "round_cpu",
]


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
        cpu_honest_s: that, plus the honest collectors' ingest while the attackers' steps
            ran, less the attackers' collectors' ingest outside them (module docstring).
        wall_without_attackers_s: wall seconds less the attackers' own share and train.
        server_cpu_s: the nats-server's CPU seconds over the round (None: none measured).
    """

    cpu_s: float
    wall_s: float
    cpu_without_attackers_s: float
    wall_without_attackers_s: float
    server_cpu_s: float | None
    cpu_honest_s: float = 0.0


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
        self._honest_in_attacker = self._attacker_outside = 0.0
        self._in_attacker = False

    def start(self) -> None:
        """Start a round."""
        self._c0, self._w0, self._s0 = self._cpu(), self._wall(), self._server()
        self._attacker_cpu = self._attacker_wall = 0.0
        self._honest_in_attacker = self._attacker_outside = 0.0

    def collector(self, ingest: Callable[P, R], *, honest: bool) -> Callable[P, R]:
        """A node's collector's ``ingest``, its CPU charged to that node whenever it runs:
        an honest one's during an attacker's step is counted back as honest work, an
        attacker's outside its steps is taken out of it."""

        @functools.wraps(ingest)
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            if honest != self._in_attacker:
                return ingest(*args, **kwargs)
            c0 = self._cpu()
            try:
                return ingest(*args, **kwargs)
            finally:
                spent = self._cpu() - c0
                if honest:
                    self._honest_in_attacker += spent
                else:
                    self._attacker_outside += spent

        return counted

    @contextmanager
    def attacker(self) -> Iterator[None]:
        """Count the block as an attacker's own step (subtracted by the old measure only)."""
        c0, w0 = self._cpu(), self._wall()
        self._in_attacker = True
        try:
            yield
        finally:
            self._in_attacker = False
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
            cpu_honest_s=cpu
            - self._attacker_cpu
            + self._honest_in_attacker
            - self._attacker_outside,
        )


COST_METRICS = (
    "cpu_ratio_off",
    "cpu_ratio_on",
    "honest_cpu_ratio_off",
    "honest_cpu_ratio_on",
    "round_s_ratio_off",
    "round_s_ratio_on",
    "server_cpu_ratio_off",
    "server_cpu_ratio_on",
)
"""What :func:`cost_ratios` gives, the defences off and on."""


def round_cpu(run: RunMeasure) -> list[float]:
    """The whole round's CPU per round (the old measure for runs recorded before it)."""
    return run.round_cpu_s or run.round_s


def ratio(values: Sequence[float], base: Sequence[float]) -> float:
    """The mean of ``values`` over the mean of ``base`` (NaN where either is empty)."""
    if not values or not base:
        return float("nan")
    return (sum(values) / len(values)) / max(sum(base) / len(base), 1e-12)


def _per_honest(run: RunMeasure) -> list[float]:
    """The honest nodes' own CPU per round, per honest node: the no-attack run has every
    node honest, an attack run only ``nodes - attackers``."""
    return [cpu / max(len(run.honest), 1) for cpu in run.round_cpu_honest_s]


def cost_ratios(
    off: RunMeasure, on: RunMeasure, base_off: RunMeasure, base_on: RunMeasure
) -> dict[str, float]:
    """A CPU attack's measures for one seed (:data:`COST_METRICS`; the summary's module
    docstring), each attack run over the no-attack run with the same defences."""
    return {
        "cpu_ratio_off": ratio(round_cpu(off), round_cpu(base_off)),
        "cpu_ratio_on": ratio(round_cpu(on), round_cpu(base_on)),
        "honest_cpu_ratio_off": ratio(_per_honest(off), _per_honest(base_off)),
        "honest_cpu_ratio_on": ratio(_per_honest(on), _per_honest(base_on)),
        "round_s_ratio_off": ratio(off.round_s, base_off.round_s),
        "round_s_ratio_on": ratio(on.round_s, base_on.round_s),
        "server_cpu_ratio_off": ratio(off.server_cpu_s, base_off.server_cpu_s),
        "server_cpu_ratio_on": ratio(on.server_cpu_s, base_on.server_cpu_s),
    }
