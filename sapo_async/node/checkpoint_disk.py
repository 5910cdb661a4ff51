"""The checkpoint writer's disk: the room a checkpoint needs, the one lock on its directory,
the partials a failed or killed write leaves, and the message a failed write becomes.

Owns :func:`checkpoint_bytes` (about what the next write takes: every tensor of the model
and of the optimizer state that exists, tied weights once, plus room for the manifest and
headers), :func:`sole_writer` (an exclusive, non-blocking ``flock`` on the checkpoint
directory), :func:`remove_partial` and :func:`removed` (what a writer leaves behind), and
:func:`write_failure` (the one-line message of a failed write). :data:`WRITE_ERRORS` is
what a write raises: the OS's, safetensors' own (a full disk is a ``SafetensorError``, not
an ``OSError``), torch's ``RuntimeError`` and JSON's.

Invariants:

* one writer per directory: while :func:`sole_writer` holds the lock any other writer is
  refused at once with a :class:`~sapo_async.errors.CheckpointError` (two writers would
  rotate each other's checkpoints away); the kernel releases the lock of a killed process;
* partials are removed only while the lock is held, so every one found was left by a
  writer killed mid-write, never one still writing; on a file system without ``flock``
  nothing is removed;
* a failed write is reported as a full disk when the error says so (``ENOSPC``,
  ``EDQUOT``, or their text in safetensors' message) or when the space free is less than
  the checkpoint needs (torch's own writer says "unexpected pos"); the message is one
  line naming the directory, the space free and needed, what is left over and what to do.

Deliberately does not know the checkpoint layout or format: :mod:`sapo_async.node.checkpoint`
writes, rotates and loads checkpoints and passes the names of its temporary files here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from sapo_async.errors import CheckpointError

__all__ = [
    "WRITE_ERRORS",
    "checkpoint_bytes",
    "remove_partial",
    "removed",
    "sole_writer",
    "write_failure",
]

WRITE_ERRORS = (OSError, TypeError, ValueError, RuntimeError, SafetensorError)
"""What a checkpoint write raises: the OS's, safetensors' own (a full disk is a
``SafetensorError``, not an ``OSError``), torch's ``RuntimeError`` and JSON's."""
_OVERHEAD_BYTES = 64 << 10
"""Room a checkpoint takes besides its tensors: the manifest (Python and NumPy RNG states,
about 20 KB), safetensors headers, the torch RNG state, and file system blocks."""
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")


def checkpoint_bytes(model: Any, optimizer: torch.optim.Optimizer) -> int:
    """About how many bytes a checkpoint of ``model`` and ``optimizer`` takes as they are
    now: every tensor written (tied weights once) plus room for the manifest and headers.

    Unlike :func:`~sapo_async.node.checkpoint.state_bytes` it counts the optimizer state
    that exists (none before the first step), so it is what the next write needs.
    """
    weights = {t.data_ptr(): t.nbytes for t in model.state_dict().values()}
    moments = sum(
        v.nbytes
        for state in optimizer.state_dict()["state"].values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    return int(sum(weights.values()) + moments) + _OVERHEAD_BYTES


@contextmanager
def sole_writer(directory: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``directory`` while writing; yields whether it is held
    (False on a file system without ``flock``: then nothing is cleaned up).

    Raises:
        CheckpointError: another process holds it (two writers would rotate each other's
            checkpoints away).
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            raise CheckpointError(
                f"another process is writing checkpoints in {directory}: two nodes (or "
                "trainings) must not share a checkpoint directory; give each its own "
                "node.data_dir (or --checkpoint-dir)"
            ) from None
        except OSError:
            held = False
        yield held
    finally:
        os.close(fd)  # releases the lock


def remove_partial(directory: Path, *, temp_dirs: str, temp_file: str) -> None:
    """Remove what a writer killed mid-write left: the directories matching the glob
    ``temp_dirs`` and the file ``temp_file`` (only while holding the lock: no other writer
    is at work)."""
    for partial in directory.glob(temp_dirs):
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
    (directory / temp_file).unlink(missing_ok=True)


def removed(path: Path) -> bool:
    """Remove ``path`` (a directory or a file); whether it is gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass  # reported by the caller: the path is still there
    return not path.exists()


def _is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
        return True
    text = str(exc)  # safetensors: "I/O error: No space left on device (os error 28)"
    return any(t in text for t in _DISK_FULL_TEXTS)


def write_failure(
    directory: Path,
    name: str,
    exc: BaseException,
    left: list[Path],
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
) -> str:
    """The one-line message for a failed write of checkpoint ``name`` (after cleaning up;
    ``left`` is what could not be removed)."""
    cause = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    if left:
        aftermath = f"{', '.join(map(str, left))} is left over (a partial checkpoint): delete it"
    else:
        aftermath = "nothing partial was left and older checkpoints are untouched"
    try:
        free: int | None = shutil.disk_usage(directory).free
    except OSError:
        free = None
    try:
        needed = checkpoint_bytes(model, optimizer)
    except (*WRITE_ERRORS, AttributeError):  # what failed may be the model itself
        needed = 0
    if not _is_disk_full(exc) and (free is None or free >= needed):
        return (
            f"writing checkpoint {name} in {directory} failed ({cause}); {aftermath}. Check "
            "that the directory is writable and its disk healthy, then restart"
        )
    more = needed - (free or 0)
    return (
        f"cannot write checkpoint {name}: the disk holding {directory} is full ("
        f"{'unknown space' if free is None else _format_bytes(free)} free, the checkpoint "
        f"needs about {_format_bytes(needed) if needed else 'as much as the last one'}); "
        f"{aftermath}. Free space there "
        f"({'at least ' + _format_bytes(more) + ' more' if more > 0 else 'more'}) or move "
        f"it to a larger disk, then restart ({cause})"
    )


def _format_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
