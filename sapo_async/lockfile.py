"""One node per data directory and per key on a ledger: the OS locks a second node meets.

Owns :func:`hold` (an exclusive, non-blocking ``flock`` on a lock file, with the holder's
pid written into it), :func:`hold_dir` (that lock on ``<directory>/node.lock``),
:func:`hold_key` (that lock on a per-user file named by a ledger and an address, under
``${XDG_CACHE_HOME:-~/.cache}/sapo-async/locks``), and the one-line
:class:`~sapo_async.errors.ConfigError` a second holder gets (exit 2 on the command line),
naming what is held, the holder's pid, the lock file and what to do.

Guarantees, for processes of one host on a local file system:

* while a lock is held, any other attempt on the same file (another process, or another
  :func:`hold` in this one) is refused at once, never waits;
* the kernel releases a lock when its holder's file descriptor closes: on leaving
  :func:`hold`, on exit, and on any death, SIGKILL included; so a lock file left behind
  (a dead holder's pid in it) never blocks the next node;
* a lock file is removed only by its holder, while still holding it, and a new holder
  checks that the file it locked is still the one at the path (else it tries again), so
  removing it on release never lets two processes in.

Does not know what a node is: ``sapo-async node`` holds its data directory and
:meth:`~sapo_async.node.swarm.Swarm.start` a node's checkpoint directory and its key on
an RPC ledger. Read-only commands (``verify``, ``doctor``, the audits) take no lock. Not
covered: nodes on two hosts (flock does not cross hosts, and NFS may not honour it), and
the key of two users on one host (each has their own lock directory). A child forked
without ``exec`` shares its parent's lock and keeps it until it exits too (``exec``'d
children, such as nats-server and anvil, do not inherit it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from sapo_async.errors import ConfigError

__all__ = ["LOCK_NAME", "hold", "hold_dir", "hold_key", "key_lock_path"]

LOCK_NAME = "node.lock"
"""The lock file :func:`hold_dir` takes in a directory."""

_ATTEMPTS = 8  # a holder releasing (and removing) the file between our open and lock: retry


@contextlib.contextmanager
def hold(path: Path, *, what: str, field: str, advice: str) -> Iterator[Path]:
    """Hold an exclusive lock on the file ``path`` (created, with its directory) while inside.

    Args:
        path: the lock file.
        what: what the lock stands for, for the message (``data directory /srv/sapo``).
        field: the setting to name in the error (``node.data_dir``).
        advice: what to do, for the message.

    Yields:
        ``path``, holding this process's pid.

    Raises:
        ConfigError: another holder has it (``<what> is in use by another node (pid N,
            lock file <path>): <advice>``), or ``path`` cannot be created or locked.
    """
    fd = _acquire(path, what=what, field=field, advice=advice)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(OSError):
            if _same_file(fd, path):  # still ours: remove it while the lock keeps others out
                path.unlink()
        os.close(fd)


def hold_dir(
    directory: Path, *, what: str, field: str, advice: str
) -> contextlib.AbstractContextManager[Path]:
    """:func:`hold` on ``<directory>/node.lock``; ``what`` is completed with the directory
    (``data directory`` -> ``data directory /srv/sapo``)."""
    directory = Path(directory).expanduser().absolute()
    return hold(directory / LOCK_NAME, what=f"{what} {directory}", field=field, advice=advice)


def key_lock_path(address: str, *, ledger: str) -> Path:
    """The per-user lock file of ``address`` on ``ledger`` (any text that tells ledgers
    apart: the contract and the chain), under ``${XDG_CACHE_HOME:-~/.cache}``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(f"{ledger}\n{address.lower()}".encode()).hexdigest()[:16]
    return Path(cache) / "sapo-async" / "locks" / f"key-{address.lower()}-{digest}.lock"


def hold_key(
    address: str, *, ledger: str, shown: str | None = None
) -> contextlib.AbstractContextManager[Path]:
    """:func:`hold` on :func:`key_lock_path`: one node per key on one ledger (two would
    commit conflicting rounds for the same address).

    Args:
        address: the node's address.
        ledger: what identifies the ledger (hashed into the file's name, never shown: it
            may be a URL with credentials).
        shown: how the message names the ledger (its contract address).
    """
    return hold(
        key_lock_path(address, ledger=ledger),
        what=f"key {address} on ledger {shown or '(this ledger)'}",
        field="identity.keystore",
        advice="run one node per key on a ledger: stop that node, or give this one its "
        "own key ([identity] keystore; a data directory without key.json makes a new one)",
    )


def _acquire(path: Path, *, what: str, field: str, advice: str) -> int:
    for _ in range(_ATTEMPTS):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the lock file {path} of {what}: {exc.strerror or exc}",
                field=field,
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"cannot lock {path} ({what}): {exc.strerror or exc}; put it on a local "
                    "file system",
                    field=field,
                ) from exc
            who = f"pid {holder}" if holder else "pid not yet written"
            raise ConfigError(
                f"{what} is in use by another node ({who}, lock file {path}): {advice}",
                field=field,
            ) from None
        if _same_file(fd, path):
            return fd
        os.close(fd)  # the holder we waited on removed it: lock the new one
    raise ConfigError(f"cannot lock {path} ({what}): it keeps being replaced", field=field)


def _same_file(fd: int, path: Path) -> bool:
    try:
        at_path = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
