"""Child server processes: spawn a binary, wait until it answers, stop it.

Owns the one way sapo_async runs a server as a child process (nats-server, anvil): the
child's output goes to a log file, it is handed back only once a probe says it answers, a
child that exits while starting fails at once with the tail of its output, and stopping
sends a signal (SIGTERM by default), waits under a deadline, then SIGKILLs. Also the one
free-port helper and the one "does this port accept connections" probe.

Deliberately does not know what the child serves: readiness is a caller's probe (a log
line, a TCP port, a JSON-RPC answer) and the error a failed start raises is the caller's
family (:class:`~sapo_async.errors.TransportUnavailable` for NATS,
:class:`~sapo_async.errors.LedgerUnavailable` for a chain).

Invariants:
    * output goes to a file, never a pipe (nobody reads a pipe, and a full one blocks the
      child);
    * readiness is polled on the :data:`READY_POLL` backoff schedule, under a deadline,
      and a failed start leaves no child running;
    * :meth:`ChildProcess.stop` is idempotent; :func:`live_children` lists every child
      started here that has not been seen to exit (test fixtures fail a test that leaks one);
    * on Linux a child dies with its parent: it is spawned with ``PR_SET_PDEATHSIG`` set to
      its stop signal (through a small launcher that then execs it), so a parent killed with
      SIGKILL (no chance to stop anything) does not leave a nats-server or anvil holding
      its port and store. The kernel sends that signal
      when the *thread* that spawned the child ends, so it is set only for children spawned
      from the main thread (where the event loop of a node runs); a child spawned from
      another thread is stopped as before, by :meth:`ChildProcess.stop`.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio

from sapo_async.backoff import Backoff
from sapo_async.errors import SapoError
from sapo_async.limits import (
    RETRY_JITTER,
    SERVER_POLL_BASE_S,
    SERVER_POLL_MAX_S,
    SERVER_START_TIMEOUT_S,
    SERVER_STOP_TIMEOUT_S,
)

__all__ = ["READY_POLL", "ChildProcess", "StopOnExit", "free_port", "live_children", "port_open"]

READY_POLL = Backoff(SERVER_POLL_BASE_S, SERVER_POLL_MAX_S, jitter=RETRY_JITTER)
"""How often a starting child is probed: 10 ms doubling up to 0.2 s (jittered, as every retry)."""

_LIVE: dict[int, ChildProcess] = {}

_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "parent, sig = int(sys.argv[1]), int(sys.argv[2])\n"
    "ctypes.CDLL(None).prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != parent:  # the parent died before prctl took effect\n"
    "    os.kill(os.getpid(), sig)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)
"""Launcher run as ``python -I -S -c`` in front of a child's command line: it sets the
parent-death signal, then execs the server in its own place (same pid; the setting survives
exec). A launcher rather than ``preexec_fn``, which is unsafe in a process with threads."""


def _die_with_parent(argv: list[str], sig: signal.Signals) -> list[str]:
    """``argv`` behind the launcher above, where the parent-death signal can be relied on
    (Linux, main thread: see the module docstring); ``argv`` itself elsewhere."""
    if not sys.platform.startswith("linux"):
        return argv
    if threading.current_thread() is not threading.main_thread():
        return argv
    launcher = [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT]
    return [*launcher, str(os.getpid()), str(int(sig)), *argv]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listened on a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def lasting_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that bind now, chosen *below* the kernel's
    ephemeral range, for servers that are stopped and started again on the same port.

    :func:`free_port` hands out ports from the ephemeral range, the one the kernel also
    takes source ports of outgoing connections from: while a server is down, any client
    on the machine may get its port as a source port, and the server's restart then fails
    with "address already in use" (the chaos run's NATS router port, 2026-12-07).
    Elsewhere than Linux (no ``ip_local_port_range`` to read), :func:`free_port`'s.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return [free_port(host) for _ in range(count)]
    candidates = list(range(max(1024, low - 20_000), low))
    random.SystemRandom().shuffle(candidates)
    out: list[int] = []
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        out.append(port)
        if len(out) == count:
            return out
    raise OSError(f"no {count} free ports on {host} below the ephemeral range ({low})")


def port_open(host: str, port: int, *, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port`` right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def live_children() -> list[ChildProcess]:
    """Children started by this process that are still running, oldest first."""
    for pid, child in list(_LIVE.items()):
        if not child.running:
            del _LIVE[pid]
    return list(_LIVE.values())


class StopOnExit:
    """Base of whatever owns running children: ``with`` hands it back and stops it on exit."""

    def stop(self) -> None:
        """Stop what runs; idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ChildProcess(StopOnExit):
    """A server binary run as a child process; stopped by :meth:`stop` or on ``with`` exit.

    Args:
        name: for logs and errors (``nats-server``, ``anvil``).
        argv: the command line.
        log_path: where its stdout and stderr are appended.
        error: the error family a failed start raises (a subclass of ``SapoError``).
        stop_signal: the polite signal :meth:`stop` sends before SIGKILL.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        error: type[SapoError] = SapoError,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._error = error
        self._stop_signal = stop_signal
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        """The process id while it runs, else ``None``."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the child is alive."""
        return self._proc is not None and self._proc.poll() is None

    def spawn(self) -> None:
        """Start the child (not yet ready: see :meth:`wait_ready`).

        Raises:
            OSError: the binary cannot be executed.
        """
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        # Popen duplicates the file descriptor, so our handle can close at once.
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                _die_with_parent(self.argv, self._stop_signal),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _LIVE[self._proc.pid] = self

    def output(self) -> str:
        """Everything the child wrote since it was last spawned."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its output since the last spawn, for error messages."""
        return "\n".join(self.output().splitlines()[-lines:])

    def _probes(self, probe: Callable[[], bool], timeout: float, what: str) -> Iterator[float]:
        # The one readiness loop, shared by the blocking and the async waiter: it yields
        # how long to sleep before the next probe, and returns once the probe succeeds.
        deadline = time.monotonic() + timeout
        for delay in READY_POLL.delays():
            if not self.running:
                code = None if self._proc is None else self._proc.returncode
                tail = self.log_tail()
                self.stop()
                raise self._error(
                    f"{self.name} exited with code {code} while starting ({what}); "
                    f"its output:\n{tail}"
                )
            if probe():
                return
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise self._error(
                    f"{self.name} did not answer within {timeout} s ({what}); its output:\n{tail}"
                )
            yield delay

    def wait_ready(
        self, probe: Callable[[], bool], *, timeout: float = SERVER_START_TIMEOUT_S, what: str = ""
    ) -> None:
        """Block until ``probe()`` is true; stop the child and raise if it exits or times out.

        Args:
            probe: a quick, non-blocking check that the child answers.
            timeout: seconds to wait.
            what: what is awaited, for the error message (``RPC on 127.0.0.1:8545``).

        Raises:
            SapoError: (the ``error`` family) the child exited, or did not answer in time;
                the message names it and carries the tail of its output.
        """
        for delay in self._probes(probe, timeout, what):
            time.sleep(delay)  # a child's readiness has no event to block on

    async def wait_ready_async(
        self,
        probe: Callable[[], bool],
        *,
        # The deadline belongs to the child: when it passes, the child is stopped and the
        # error names it with its output, which a caller's fail_after could not do.
        timeout: float = SERVER_START_TIMEOUT_S,  # noqa: ASYNC109
        what: str = "",
    ) -> None:
        """:meth:`wait_ready` for async callers: the same loop, sleeping with anyio."""
        for delay in self._probes(probe, timeout, what):
            await anyio.sleep(delay)

    def start(
        self, probe: Callable[[], bool], *, timeout: float = SERVER_START_TIMEOUT_S, what: str = ""
    ) -> None:
        """:meth:`spawn`, then :meth:`wait_ready`."""
        self.spawn()
        self.wait_ready(probe, timeout=timeout, what=what)

    def stop(self, timeout: float = SERVER_STOP_TIMEOUT_S) -> None:
        """Send the stop signal, wait up to ``timeout`` s, then SIGKILL; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(self._stop_signal)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        _LIVE.pop(proc.pid, None)
