"""doctor's disk checks: ``data_dir`` writable, and free space for the node's checkpoints.

Owns :func:`check_disk`, which fails when ``node.data_dir`` (or, before it exists, its
nearest existing ancestor) is not writable or has less than a fixed floor free, and sizes
checkpoints from the newest one on disk (``LATEST``, else the last ``round-*``): it fails
when not one more fits and warns under three checkpoints' worth (the two a node keeps and
the one it is writing). Also :func:`unwritable`, the writability test the model check
shares for the model cache.

Does not know how checkpoints are written or rotated: it reads the directory layout
:mod:`sapo_async.node.checkpoint` leaves and a count of kept checkpoints, and imports
neither the node nor the other checks. Only reads (``os.access``, ``stat``, free space):
it creates nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sapo_async.limits import DOCTOR_MIN_FREE_BYTES
from sapo_async.ops.config import NodeConfig
from sapo_async.ops.doctor_check import Check

__all__ = ["check_disk", "existing_ancestor", "unwritable"]


def existing_ancestor(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest ancestor that does."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def unwritable(name: str, path: Path, detail: str) -> Check | None:
    """A failed check when ``path`` (or, before it exists, its parent) is not writable."""
    if os.access(existing_ancestor(path), os.W_OK):
        return None
    return Check(name, "fail", detail, "choose a writable node.data_dir")


_CHECKPOINTS_KEPT = 2
"""How many checkpoints a node keeps (``save_checkpoint``'s ``keep``, which the node uses):
it writes the next one beside them, so at its peak it holds one more."""


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _newest_checkpoint(directory: Path) -> tuple[Path, int] | None:
    """The newest checkpoint in ``directory`` (the one ``LATEST`` names, else the last
    ``round-*``; the layout :mod:`sapo_async.node.checkpoint` writes) and its size in bytes;
    None when there is none or it cannot be read."""
    try:
        named = (directory / "LATEST").read_text().strip()
    except (OSError, UnicodeDecodeError):
        named = ""
    try:
        if named.startswith("round-") and os.sep not in named and (directory / named).is_dir():
            newest = directory / named
        else:
            rounds = sorted(p for p in directory.glob("round-*") if p.is_dir())
            if not rounds:
                return None
            newest = rounds[-1]
        return newest, sum(f.stat().st_size for f in newest.iterdir() if f.is_file())
    except OSError:
        return None


def check_disk(cfg: NodeConfig, *, min_free_bytes: int = DOCTOR_MIN_FREE_BYTES) -> Check:
    """Check that ``data_dir`` is writable and has room for checkpoints.

    Fails under ``min_free_bytes`` free where checkpoints go. Once a checkpoint exists, its
    size sets the bar: fails when not even one more fits (the node stops at its next
    checkpoint), warns under three checkpoints' worth (the two a node keeps and the one it
    is writing: a margin, as the kept ones may already be on disk). Without one yet, only
    ``min_free_bytes`` applies.
    """
    data_dir = cfg.node.data_dir
    problem = unwritable(
        "disk",
        data_dir,
        f"cannot write to {existing_ancestor(data_dir)} (for node.data_dir {data_dir})",
    )
    if problem is not None:
        return problem
    anchor = existing_ancestor(cfg.checkpoint_dir)
    free = shutil.disk_usage(anchor).free
    fix = "free some space or move node.data_dir to a larger disk"
    if free < min_free_bytes:
        return Check(
            "disk",
            "fail",
            f"only {free / 2**30:.1f} GiB free at {anchor}; checkpoints need at least "
            f"{min_free_bytes / 2**30:.1f} GiB",
            fix,
        )
    newest = _newest_checkpoint(cfg.checkpoint_dir)
    if newest is None:
        return Check(
            "disk",
            "ok",
            f"{_size(free)} free for {data_dir} (no checkpoint yet to size them from)",
        )
    path, size = newest
    count = _CHECKPOINTS_KEPT + 1
    wanted = count * size
    sized = (
        f"the newest checkpoint, {path}, takes {_size(size)}, and {count} checkpoints' worth "
        f"(the {_CHECKPOINTS_KEPT} a node keeps and the one it is writing) is {_size(wanted)}"
    )
    if free < size:
        return Check(
            "disk",
            "fail",
            f"only {_size(free)} free at {anchor}, less than one checkpoint: {sized}; the "
            "node stops at its next checkpoint",
            fix,
        )
    if free < wanted:
        return Check("disk", "warn", f"only {_size(free)} free at {anchor}: {sized}", fix)
    return Check(
        "disk",
        "ok",
        f"{_size(free)} free for {data_dir}: {count} checkpoints' worth of {_size(size)}",
    )
