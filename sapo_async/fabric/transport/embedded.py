"""The embedded default: a private ``nats-server`` with JetStream, and the one way to connect.

Owns (1) :class:`EmbeddedNats`, a private nats-server (started through
:func:`~sapo_async.fabric.transport.server.spawn_nats_server`) on a free loopback port with
a temporary (or given) store directory, stopped on exit and restartable on the same port
and store; (2) :class:`NatsOptions` and :func:`connect_nats`, the single helper every part
of sapo_async uses to open a NATS connection, so credentials, nkeys, TLS and reconnect
policy are set in one place; (3) :func:`nats_endpoint`, which yields a URL: the given one,
or an embedded server's.

Deliberately does not know about streams or rollouts (see ``jetstream.py``).

Invariants:
    * a started server is always stopped (SIGTERM, then SIGKILL after a deadline) when its
      context exits, even on cancellation;
    * ``live_embedded_servers()`` lists every nats-server process this process started and
      has not yet seen exit (the test suite fails a test that leaves one running).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import anyio
import nats.errors
from nats.aio.client import Client as NatsClient

from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.fabric.transport.server import NatsServer, spawn_nats_server
from sapo_async.limits import CONNECT_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.process import free_port, live_children

__all__ = [
    "EmbeddedNats",
    "NatsOptions",
    "connect_nats",
    "live_embedded_servers",
    "nats_endpoint",
]

_log = get_logger("nats")


def live_embedded_servers() -> list[int]:
    """Process ids of nats-server children started here and still running."""
    return sorted(c.pid for c in live_children() if c.name == "nats-server" and c.pid)


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
        self._server: NatsServer | None = None

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
        return self._server.process.pid if self._server is not None else None

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
        # max_payload has no command-line flag, so the settings go in a config file.
        config = self.store_dir / "nats-server.conf"
        self.port = self.port or free_port()
        config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: {self._max_payload}\n"
            f"jetstream {{ store_dir: {json.dumps(str(self.store_dir / 'js'))} }}\n"
            f"{self._extra_config}\n"
        )
        server = spawn_nats_server(
            self.store_dir, port=self.port, config_file=config, name="nats-server"
        )
        self._server = server
        try:
            await server.wait_ready_async()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the server gracefully (SIGTERM flushes the store), killing it past the
        deadline; idempotent and shielded from cancellation."""
        server, self._server = self._server, None
        if server is None:
            return
        pid = server.process.pid
        with anyio.CancelScope(shield=True):
            # The wait for a child's exit blocks; a worker thread keeps the loop free.
            await anyio.to_thread.run_sync(server.stop)
        _log.info("nats_server_stopped", pid=pid)

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

    async def __aexit__(self, *exc_info: object) -> None:
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
        reconnect: keep reconnecting for ever (a node); ``False`` gives up after two quick
            tries of a first connection and never reconnects (a one-shot probe: doctor).
        consumer_owner: the owner token this credential's permissions bind its consumers
            to: its consumers are named ``<owner>-<k>`` (None: random names).
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
    reconnect: bool = True
    consumer_owner: str | None = None


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
    """Open a NATS connection (the one helper everything uses); by default it reconnects
    for ever.

    Args:
        options: where and how to connect; ``options.url`` must be set.

    Returns:
        A connected nats-py client; close it with ``await nc.close()``.

    Raises:
        ConfigError: no URL, a credentials or TLS file is missing or unreadable, or nkey
            auth is asked for without the nkeys package.
        TransportUnavailable: the server could not be reached in time; the message carries
            what the server and the client reported (e.g. an authorization violation).
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
    reported: list[str] = []

    async def on_error(exc: Exception) -> None:
        reported.append(str(exc) or type(exc).__name__)
        log.warning("nats_error_reported", error=repr(exc))

    async def on_disconnected() -> None:
        log.info("nats_disconnected")

    async def on_reconnected() -> None:
        log.info("nats_reconnected")

    kwargs: dict[str, Any] = {
        "servers": [u.strip() for u in options.url.split(",")],
        "name": options.name,
        "connect_timeout": options.connect_timeout,
        "allow_reconnect": options.reconnect,
        # nats-py's first connect loops for ever on a refused server when this is 0 (only
        # values > 0 are checked); 1 means two tries, reconnect_time_wait apart.
        "max_reconnect_attempts": -1 if options.reconnect else 1,
        "reconnect_time_wait": 0.2 if options.reconnect else 0.1,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
    }
    if options.creds_file is not None:
        kwargs["user_credentials"] = str(options.creds_file)
    if options.nkey_seed_file is not None:
        kwargs["nkeys_seed"] = str(options.nkey_seed_file)
    try:
        tls = _tls_context(options)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files: {exc}", field="tls_cert_file") from exc
    if tls is not None:
        kwargs["tls"] = tls
        if options.tls_hostname:
            kwargs["tls_hostname"] = options.tls_hostname
    nc = NatsClient()
    try:
        with anyio.fail_after(options.connect_timeout * 2):
            await nc.connect(**kwargs)
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        # Without reconnects nats-py gives up on a refused login but leaves its socket
        # open; closing the client closes it (and is harmless when nothing is open).
        with contextlib.suppress(OSError, nats.errors.Error):
            await nc.close()
        reason = "; ".join(dict.fromkeys(reported)) or str(exc) or type(exc).__name__
        raise TransportUnavailable(f"cannot connect to NATS at {shown}: {reason}") from exc
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
