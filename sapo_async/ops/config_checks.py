"""The value checks behind node.toml's settings that pydantic's bounds cannot say.

Owns: the closest allowed name for a typo (:func:`did_you_mean`), a file that must exist
and be readable, a directory that must be (or become) writable, and a URL's host and port.
Each raises ``ValueError`` with a message naming the value and what is wrong, which
:mod:`.config` turns into one :class:`~sapo_async.errors.ConfigError` line. Knows no
section or setting.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["check_host_port", "did_you_mean", "existing_file", "writable_dir"]


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the allowed name closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def existing_file(value: Path | None) -> Path | None:
    """``value`` expanded, when it names a readable file (or is unset)."""
    if value is None:
        return None
    path = value.expanduser()
    if not path.is_file():
        raise ValueError(f"no such file: {str(path)!r}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{str(path)!r} is not readable by this user")
    return path


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


def check_host_port(url: str) -> None:
    """Raise ValueError when ``url`` has no host or a port outside 1..65535."""
    from urllib.parse import urlsplit

    for one in url.split(","):
        parts = urlsplit(one.strip())
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{one!r} has a port outside 1..65535 or not a number") from None
        if not parts.hostname:
            raise ValueError(f"{one!r} names no host")
        if port == 0:
            raise ValueError(f"{one!r} has port 0; ports are 1..65535")
