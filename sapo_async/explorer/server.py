"""Serving the explorer with uvicorn inside the caller's event loop.

Owns binding the port (so that a port in use is a :class:`ConfigError` naming it, not
uvicorn's ``sys.exit``), readiness (the context manager yields once uvicorn serves) and
stopping (the live streams end, uvicorn drains under
:data:`~sapo_async.limits.EXPLORER_SHUTDOWN_S`). Signals stay with the caller: uvicorn's
own handlers would swallow Ctrl-C meant for a swarm running beside the explorer.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Generator

import anyio
import uvicorn
from starlette.applications import Starlette

from sapo_async import limits
from sapo_async.errors import ConfigError, SapoError

__all__ = ["serving"]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the caller's loop (anyio.run, a test) owns the signals


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot serve the explorer on {host}:{port}: {exc.strerror}; pick another --port",
            field="port",
        ) from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@contextlib.asynccontextmanager
async def serving(app: Starlette, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` on ``host:port`` (0: a free port) while the block runs; yields the URL.

    Raises:
        ConfigError: the port cannot be bound.
        SapoError: uvicorn did not start in time.
    """
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=int(limits.EXPLORER_SHUTDOWN_S),
    )
    server = _Server(config)
    ended = anyio.Event()

    async def run() -> None:
        try:
            with anyio.CancelScope(shield=True):  # stopped by should_exit, below
                await server.serve(sockets=[sock])
        finally:
            sock.close()
            ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            with anyio.fail_after(limits.EXPLORER_START_TIMEOUT_S):
                while not server.started:
                    if ended.is_set():
                        raise SapoError(f"the explorer on {host}:{bound} stopped while starting")
                    await anyio.sleep(0.02)
            shown = f"[{host}]" if ":" in host else host
            yield f"http://{shown}:{bound}"
        finally:
            app.state.closing = True
            server.should_exit = True
