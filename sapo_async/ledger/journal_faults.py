"""Why a journal call failed, and what the volunteer does about it.

Owns the translation of sqlite3's and the OS's errors into a
:class:`~sapo_async.errors.JournalError` ``cause`` (``locked``, ``full``, ``read_only``,
``io``, ``damaged``) and the advice its message gives for each: wait (a lock another
process holds), free space (with how much is free and needed), fix the disk or its
permissions, or, for a damaged file only, restore or move it aside. Only ``locked`` is worth
waiting out (:mod:`sapo_async.node.commitments` does); the others stop the node, its held
commitments safe in its checkpoint.

Deliberately does not know the journal's schema or who retries.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

__all__ = ["advice", "cause_of"]

_NEEDS_FREE = 2 * 1000 * 4096
"""Free bytes the journal asks for on a full disk: twice the write-ahead log SQLite keeps
before folding it into the file (1,000 pages of 4 KiB, its defaults)."""

# SQLite's primary result codes (https://www.sqlite.org/rescode.html) by what they mean here.
_CAUSES = {5: "locked", 6: "locked", 8: "read_only", 10: "io", 13: "full", 14: "read_only"}
_ERRNO_CAUSES = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "read_only"}
_ERRNO_CAUSES[errno.EACCES] = _ERRNO_CAUSES[errno.EPERM] = "read_only"


def cause_of(exc: BaseException) -> str:
    """Why a journal call failed: ``locked``, ``full``, ``read_only``, ``io`` or ``damaged``."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _CAUSES:
        return _CAUSES[code & 0xFF]
    if isinstance(exc, OSError) and exc.errno in _ERRNO_CAUSES:
        return _ERRNO_CAUSES[exc.errno]
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return "locked"  # a build without extended result codes
    return "damaged"


def advice(cause: str, path: Path, exc: BaseException) -> str:
    """What is wrong with the journal at ``path``, and what to do, for a failure's ``cause``."""
    if cause == "locked":
        return (
            f"{exc}: another process holds its write lock (a program that opened it, or a "
            "second node on this data directory); the node waits and retries, nothing is lost"
        )
    if cause == "full":
        free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
        return (
            f"{exc}: the disk holding it is full ({free / 2**20:.1f} MiB free, the journal "
            f"needs {_NEEDS_FREE / 2**20:.0f} MiB): free space there and start the node again; "
            "commitments not yet journaled wait in the latest checkpoint and are journaled then"
        )
    if cause in ("read_only", "io"):
        what = {
            "read_only": "it cannot be written (a read-only file, folder or filesystem)",
            "io": "the disk failed a read or write (check the disk)",
        }[cause]
        return (
            f"{exc}: {what}; fix that and start the node again: commitments not yet "
            "journaled wait in the latest checkpoint and are journaled then"
        )
    return (
        f"{exc}. The file was left as it is: restore it from a backup, or move it aside and "
        "the node starts a new journal (commitments in it that never reached the chain are "
        "then lost)"
    )
