"""structlog set-up: a readable console on a TTY, one JSON object per line otherwise.

Owns only the process-wide logging configuration. Events are past-tense facts
(``rollout_published``); context (node, actor, round, policy version) is bound once per
context with ``structlog.contextvars`` or ``logger.bind``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["configure_logging", "get_logger"]

_configured = False


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of writing, not at configuration
    (a stream captured at configure time, e.g. by a test runner, may be closed later)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(*, level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger once per process.

    Args:
        level: stdlib level name (``DEBUG``, ``INFO``, ...).
        json: force JSON lines (``True``) or the console renderer (``False``); by default
            JSON unless stderr is a TTY.
    """
    global _configured  # noqa: PLW0603 - one process-wide switch is the point
    use_json = (not sys.stderr.isatty()) if json is None else json
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        from sapo_async.errors import ConfigError

        raise ConfigError(f"unknown log level {level!r}", field="log_level")
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(name)s %(message)s")
    _configured = True


def get_logger(name: str, **bound: Any) -> Any:
    """Return a structlog logger bound to ``component=name`` and any extra context."""
    # Initial values go to the lazy proxy (not .bind()), so loggers created at import time
    # still follow a configuration made later.
    return structlog.get_logger(name, component=name, **bound)
