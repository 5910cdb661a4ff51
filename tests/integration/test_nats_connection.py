"""The embedded server and the one connection helper: binary discovery, TLS, bad options."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.embedded import (
    EmbeddedNats,
    NatsOptions,
    connect_nats,
    live_embedded_servers,
)
from sapo_async.fabric.transport.jetstream import JetStreamTransport
from sapo_async.fabric.transport.server import find_nats_server
from tests.fixtures.fabric import SWARM, child_nats_servers, make_account, make_group

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.usefixtures("no_leaks")]


async def test_nats_server_binary_is_found_from_the_installed_package() -> None:
    path = find_nats_server()
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("nats-server: v2.")


async def test_embedded_server_is_tracked_while_running_and_gone_after_exit() -> None:
    async with EmbeddedNats() as server:
        assert server.pid in live_embedded_servers()
        assert server.pid in child_nats_servers()
        store = server.store_dir
        assert store is not None
        assert store.exists()
    assert live_embedded_servers() == []
    assert child_nats_servers() == []
    assert not store.exists()  # a temporary store is deleted


async def test_restart_keeps_port_and_store(tmp_path: Path) -> None:
    async with EmbeddedNats(store_dir=tmp_path / "s") as server:
        port, pid = server.port, server.pid
        await server.restart()
        assert server.port == port
        assert server.pid != pid
        assert (tmp_path / "s" / "js").is_dir()


async def test_connect_fails_clearly_when_nothing_listens() -> None:
    with pytest.raises(TransportUnavailable, match="cannot connect"):
        await connect_nats(NatsOptions(url="nats://127.0.0.1:1", connect_timeout=0.5))


async def test_missing_credentials_file_is_a_config_error_naming_the_field(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as caught:
        await connect_nats(NatsOptions(url="nats://127.0.0.1:1", creds_file=tmp_path / "x"))
    assert caught.value.field == "creds_file"


async def test_tls_options_are_passed_through_to_a_tls_server(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    tls = f'tls {{ cert_file: "{cert}", key_file: "{key}" }}'
    async with EmbeddedNats(extra_config=tls) as server:
        options = NatsOptions(url=server.url.replace("nats://", "tls://"), tls_ca_file=cert)
        transport = await JetStreamTransport.connect(options, SWARM)
        try:
            producer = make_account(1)
            receipt = await Publisher(transport, producer).publish(make_group(producer))
            assert receipt.ack.seq == 1
        finally:
            await transport.aclose()
        # Without the CA the server's self-signed certificate is refused.
        with pytest.raises(TransportUnavailable):
            await connect_nats(
                NatsOptions(url=server.url.replace("nats://", "tls://"), connect_timeout=1)
            )


async def test_a_refused_login_names_the_servers_reason_and_fails_fast_without_reconnect() -> None:
    auth = 'authorization { user: "sapo", password: "right" }'
    async with EmbeddedNats(extra_config=auth) as server:
        wrong = server.url.replace("nats://", "nats://sapo:wrong@")
        options = NatsOptions(url=wrong, connect_timeout=5, reconnect=False)
        with pytest.raises(TransportUnavailable, match=r"(?i)authorization violation") as info:
            await connect_nats(options)
        assert "wrong" not in str(info.value)  # credentials in the URL are never shown


async def test_unreadable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    garbage = tmp_path / "cert.pem"
    garbage.write_text("not a certificate")
    options = NatsOptions(url="tls://127.0.0.1:1", tls_cert_file=garbage, tls_key_file=garbage)
    with pytest.raises(ConfigError, match="cannot load the TLS files") as info:
        await connect_nats(options)
    assert info.value.field == "tls_cert_file"
