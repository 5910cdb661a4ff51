"""The value checks behind node.toml's settings that pydantic's bounds cannot say.

Owns: the closest allowed name for a typo (:func:`did_you_mean`), a file that must exist
and be readable, a directory that must be (or become) writable, and a URL's host and port.
Each raises ``ValueError`` with a message naming the value and what is wrong, which
:mod:`.config` turns into one :class:`~sapo_async.errors.ConfigError` line. Knows no
section or setting. The checks a spec's own fields carry (:func:`existing_file`,
:func:`check_host_port`) live with the settings base, :mod:`sapo_async.policy.settings`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path

from sapo_async.policy.settings import check_host_port, existing_file

__all__ = ["check_host_port", "did_you_mean", "existing_file", "writable_dir"]


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the allowed name closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def writable_dir(value: Path) -> Path:
    """``value`` expanded, when it is (or can be created as) a writable directory."""
    path = value.expanduser()
    anchor = path.absolute()
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    if not anchor.is_dir():
        raise ValueError(f"{str(anchor)!r} is not a directory, so {str(path)!r} cannot be one")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise ValueError(f"{str(anchor)!r} is not writable by this user")
    return path
