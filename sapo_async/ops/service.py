"""A synchronous service's context-manager protocol, written once.

Owns :class:`Service`: a class with ``start()`` and ``stop()`` (idempotent, never raising
for a second call) becomes a context manager that starts on enter and stops on exit, even
when the body raised. The metrics endpoint, the status view and the reporter that joins
them are such services.

Deliberately does not know what a service runs.
"""

from __future__ import annotations

from typing import Self

from sapo_async.process import StopOnExit

__all__ = ["Service"]


class Service(StopOnExit):
    """Base of a service with ``start()`` and ``stop()``; use it with ``with``.

    The stopping half is :class:`~sapo_async.process.StopOnExit`'s, shared with what owns
    child processes; a service adds starting on enter.
    """

    def start(self) -> object:
        """Start the service (subclasses override)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self
