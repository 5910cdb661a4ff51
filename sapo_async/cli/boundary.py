"""The command line's one error boundary: the project's errors become one line and an exit code.

Owns what a volunteer sees when a command fails on purpose. Every command the app
registers is wrapped by :func:`install`; a :class:`~sapo_async.errors.SapoError` raised
anywhere below a command (a bad setting, an unreachable server, a refused commitment)
prints ``error: <message>`` on stderr as a single line and exits non-zero:

* 2 for :class:`~sapo_async.errors.ConfigError` (the volunteer's input: a file, a key, a
  variable, an argument), like click's usage errors;
* 1 for any other :class:`~sapo_async.errors.SapoError` (the world: a server, the chain);
* 130 for Ctrl-C.

Anything else is a bug in sapo_async and keeps its traceback. ``sapo-async --debug ...``
re-raises every error with its traceback (for bug reports).

Does not know what the errors mean: the message is the error's own, which names the file,
key or variable, the value and what is allowed (see :mod:`sapo_async.errors`). Invariant:
the printed message is exactly one line, whatever the error's text.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from sapo_async.errors import ConfigError, SapoError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "CONFIG_EXIT",
    "ERROR_EXIT",
    "INTERRUPT_EXIT",
    "install",
    "one_line",
    "require",
    "require_setting",
    "require_writable",
    "set_debug",
]

CONFIG_EXIT = 2
"""Exit code for bad input (click uses 2 for usage errors: same family)."""
ERROR_EXIT = 1
"""Exit code for a failure of the world (a server, the chain, a file that went bad)."""
INTERRUPT_EXIT = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""

_state = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def set_debug(value: bool) -> None:
    """Show tracebacks (``--debug``) instead of one-line messages."""
    _state["debug"] = value


def one_line(message: str) -> str:
    """``message`` folded onto one line: line breaks and indentation become ``; ``."""
    parts = [part.strip() for part in message.splitlines() if part.strip()]
    if not parts:
        return message.strip()
    head, rest = parts[0], parts[1:]
    if rest and head.endswith(":"):
        return head + " " + "; ".join(rest)
    return "; ".join(parts)


def _ours(exc: BaseException) -> SapoError | None:
    """The error to report for ``exc``: itself if it is one of ours, or the first of ours in
    an exception group (a task group's) whose every other member is one of ours too or a
    cancellation; None for anything else (a bug, which keeps its traceback)."""
    if isinstance(exc, SapoError):
        return exc
    if not isinstance(exc, BaseExceptionGroup):
        return None
    ours, rest = exc.split(SapoError)
    if ours is None or (rest is not None and rest.split(_cancellations)[1] is not None):
        return None
    first: BaseException = ours
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first if isinstance(first, SapoError) else None


def _cancellations(exc: BaseException) -> bool:
    # What a task group adds beside the error that cancelled it (asyncio's or trio's kind).
    return type(exc).__name__ in ("CancelledError", "Cancelled")


def _guard(fn: F) -> F:
    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (SapoError, BaseExceptionGroup) as caught:
            exc = _ours(caught)
            if exc is None or _state["debug"]:
                raise
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            code = CONFIG_EXIT if isinstance(exc, ConfigError) else ERROR_EXIT
            raise typer.Exit(code=code) from exc
        except KeyboardInterrupt as exc:
            if _state["debug"]:
                raise
            typer.echo("interrupted", err=True)
            raise typer.Exit(code=INTERRUPT_EXIT) from exc

    guarded.sapo_guarded = True  # type: ignore[attr-defined]
    return guarded  # type: ignore[return-value]


def install(app: typer.Typer) -> None:
    """Wrap every command of ``app`` (and of its sub-apps) in the boundary."""
    for command in app.registered_commands:
        if command.callback is not None and not getattr(command.callback, "sapo_guarded", False):
            command.callback = _guard(command.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            install(group.typer_instance)


def require(ok: bool, option: str, value: object, allowed: str) -> None:
    """Refuse a command-line value: ``--threads = 0: must be >= 1`` (exit 2 via the boundary).

    Raises:
        ConfigError: when not ``ok``, naming the option, the value and what is allowed.
    """
    if not ok:
        raise ConfigError(f"{option} = {value!r}: must be {allowed}", field=option)


def require_writable(option: str, path: Path, *, directory: bool = False) -> None:
    """Refuse a path that cannot be written: a file's (or a directory's) nearest existing
    ancestor must be a writable directory.

    Raises:
        ConfigError: naming the option and the path.
    """
    anchor = path.absolute() if directory else path.absolute().parent
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    if not anchor.is_dir():
        raise ConfigError(f"{option} = '{path}': {anchor} is a file, not a directory", field=option)
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} = '{path}': {anchor} is not writable", field=option)


def require_setting(option: str, section: type[BaseModel], name: str, value: object) -> None:
    """Check a command-line value by the ``node.toml`` setting it mirrors (the same rules).

    Args:
        option: the option, for the message (``--nats-url``).
        section: the config section model (``NatsSection``).
        name: the setting's field in it (``urls``).
        value: the value given.

    Raises:
        ConfigError: naming the option, the value and the setting's complaint.
    """
    from pydantic import ValidationError

    try:
        section(**{name: value})
    except ValidationError as exc:
        problems = [
            str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors(include_url=False)
            if tuple(e["loc"])[:1] == (name,)
        ]
        if problems:
            raise ConfigError(
                f"{option} = {value!r}: {'; '.join(problems)}", field=option
            ) from None
