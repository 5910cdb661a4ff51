"""How one experiment run starts in its process: quiet logs, one torch thread, an event loop.

Owns :func:`run_blocking`, the one start of a run shared by the paper table, the async paper
table and the attack matrix (each run is one worker process, or this one with one worker).
Deliberately does not know what a run does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple

__all__ = ["WORKER_THREADS", "run_blocking"]

WORKER_THREADS = 1
"""Torch threads a run has (runs go side by side, one process each, on a few cores); what
its recorded environment says, and what a resumed experiment compares with."""

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def run_blocking(main: Callable[[*Ts], Awaitable[T]], *args: *Ts, log_level: str = "WARNING") -> T:
    """Run ``main(*args)`` to completion on a fresh event loop (blocking).

    Args:
        main: the run.
        args: its arguments.
        log_level: the least level logged (runs log little, so a table's progress reads).

    Returns:
        What ``main`` returned.
    """
    import anyio
    import torch

    from sapo_async.logs import configure_logging

    # A worker process starts with the library silent: show its events as the parent does.
    configure_logging(level=log_level)
    # One thread per run: runs go side by side, one process each, on a few cores.
    torch.set_num_threads(WORKER_THREADS)
    return anyio.run(main, *args)
