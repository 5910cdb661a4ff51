"""A synchronous service's context-manager protocol, written once.

Owns :class:`Service`: a class with ``start()`` and ``stop()`` (idempotent, never raising
for a second call) becomes a context manager that starts on enter and stops on exit, even
when the body raised. The metrics endpoint, the status view and the reporter that joins
them are such services.

Deliberately does not know what a service runs.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Service"]


class Service:
    """Base of a service with ``start()`` and ``stop()``; use it with ``with``."""

    def start(self) -> object:
        """Start the service (subclasses override)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the service; safe to call twice (subclasses override)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
