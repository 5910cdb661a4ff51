"""Logging: structured events through the stdlib, silent unless the application asks.

Owns how the package's events reach the application, and the command line's own output.

* A library stays quiet: every event goes to a stdlib logger under ``sapo_async``
  (``sapo_async.node``, ``sapo_async.collector``, ...), which carries a
  :class:`logging.NullHandler` and nothing else, as httpx, web3.py and nats-py do. Until the
  application configures :mod:`logging`, nothing is written anywhere. structlog's global
  configuration is never touched, so an application's own structlog set-up is its own.
* An event is structured: :func:`get_logger` gives a structlog logger whose events become
  stdlib records whose ``msg`` is an :class:`Event`, the event's dict (``event``,
  ``component``, the bound context and the call's keywords, plus anything bound with
  ``structlog.contextvars``). A plain formatter shows ``event key=value ...``; structlog's
  :class:`~structlog.stdlib.ProcessorFormatter` renders the dict as it is.
* The command line is an application: :func:`configure_logging` gives it a readable console
  on a TTY and one JSON object per line otherwise, on stderr, as it always had.

Events are past-tense facts (``rollout_published``); context (node, actor, round, policy
version) is bound once per context with ``structlog.contextvars`` or ``logger.bind``.

Deliberately does not know where an application sends its logs, nor its levels: a level is
the stdlib logger's (``logging.getLogger("sapo_async").setLevel(logging.DEBUG)``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

__all__ = ["LOGGER_NAME", "Event", "configure_logging", "get_logger"]

LOGGER_NAME = "sapo_async"
"""The stdlib logger every event of the package goes to (or to one of its children)."""

logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())


class Event(dict[str, Any]):
    """One event as a log record's message: a dict for a structured handler, and
    ``event key=value ...`` for a plain formatter (``str(record.msg)``)."""

    def __str__(self) -> str:
        rest = " ".join(f"{key}={value!r}" for key, value in self.items() if key != "event")
        event = str(self.get("event", ""))
        return f"{event} {rest}" if rest else event


def _to_record(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The last processor: the stdlib call's arguments (exceptions travel as the stdlib's)."""
    kwargs = {"exc_info": event_dict.pop("exc_info", None)}
    if event_dict.pop("stack_info", False):
        kwargs["stack_info"] = True
    return (Event(event_dict),), kwargs


_PROCESSORS: list[Callable[..., Any]] = [
    # first, so an event below the stdlib logger's level costs one comparison
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    _to_record,
]


def get_logger(name: str, **bound: Any) -> structlog.stdlib.BoundLogger:
    """A structlog logger over the stdlib logger ``sapo_async.<name>``, bound to
    ``component=name`` and any extra context.

    The stdlib logger's handlers and level are looked up at each event, so a logger made
    at import time follows a configuration made later.
    """
    stdlib_name = name if name.startswith(LOGGER_NAME) else f"{LOGGER_NAME}.{name}"
    return structlog.stdlib.BoundLogger(
        logging.getLogger(stdlib_name), _PROCESSORS, {"component": name, **bound}
    )


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of writing, not at configuration
    (a stream captured at configure time, e.g. by a test runner, may be closed later)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _Renderer(logging.Formatter):
    """Renders the package's events as the command line always showed them: the event's
    dict with its level and an ISO timestamp, through structlog's JSON or console
    renderer."""

    def __init__(self, renderer: Callable[..., Any]) -> None:
        super().__init__()
        self._processors: list[Callable[..., Any]] = [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ]

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = (
            dict(record.msg) if isinstance(record.msg, dict) else {"event": record.getMessage()}
        )
        method = record.levelname.lower()
        event["level"] = method
        if record.exc_info:
            event["exc_info"] = record.exc_info
        if record.stack_info:
            event["stack"] = record.stack_info
        rendered: Any = event
        for processor in self._processors:
            rendered = processor(None, method, rendered)
        return str(rendered)


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The command line's handler on the package's logger (one; a new configuration
    replaces it)."""


def configure_logging(*, level: str = "INFO", json: bool | None = None) -> None:
    """Show the package's events on stderr, as the command line and the experiments do.

    An application with its own logging set-up does not call this: it configures the
    ``sapo_async`` stdlib logger like any other. Calling it again replaces the previous
    configuration.

    Args:
        level: stdlib level name (``DEBUG``, ``INFO``, ...).
        json: force JSON lines (``True``) or the console renderer (``False``); by default
            JSON unless stderr is a TTY.

    Raises:
        ConfigError: an unknown level name.
    """
    use_json = (not sys.stderr.isatty()) if json is None else json
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        from sapo_async.errors import ConfigError

        raise ConfigError(f"unknown log level {level!r}", field="log_level")
    renderer: Callable[..., Any] = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    package = logging.getLogger(LOGGER_NAME)
    for old in [h for h in package.handlers if isinstance(h, _CliHandler)]:
        package.removeHandler(old)
    handler = _CliHandler(_CurrentStderr())
    handler.setFormatter(_Renderer(renderer))
    package.addHandler(handler)
    package.setLevel(numeric)
    package.propagate = False  # rendered here; the root's plain handler would repeat it
    # Other libraries' records (nats-py, web3, ...) keep the plain line they always had.
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(name)s %(message)s")
