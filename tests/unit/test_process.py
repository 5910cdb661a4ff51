"""The child-process base: ready only once it answers, clear errors when it does not, and a
stop that always leaves nothing running."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import pytest

from sapo_async.errors import SapoError, TransportUnavailable
from sapo_async.process import ChildProcess, free_port, lasting_ports, live_children, port_open


def _python(tmp_path: Path, code: str, *, name: str = "toy-server") -> ChildProcess:
    return ChildProcess(
        name, [sys.executable, "-c", code], tmp_path / f"{name}.log", error=TransportUnavailable
    )


SERVES = "import time; print('ready', flush=True); time.sleep(60)"


def test_a_child_that_exits_while_starting_is_named_with_its_output(tmp_path: Path) -> None:
    child = _python(tmp_path, "print('bad flag: --nope', flush=True); raise SystemExit(3)")
    with pytest.raises(TransportUnavailable) as info:
        child.start(lambda: False, timeout=20, what="port 1234")
    message = str(info.value)
    assert "toy-server exited with code 3 while starting (port 1234)" in message
    assert "bad flag: --nope" in message
    assert not child.running


def test_a_child_that_never_answers_times_out_and_is_stopped(tmp_path: Path) -> None:
    child = _python(tmp_path, "import time; print('still booting', flush=True); time.sleep(60)")
    with pytest.raises(TransportUnavailable, match=r"toy-server did not answer within 0.3 s"):
        child.start(lambda: False, timeout=0.3)
    assert not child.running
    assert child not in live_children()


def test_a_child_is_ready_once_its_probe_sees_the_ready_line(tmp_path: Path) -> None:
    with _python(tmp_path, SERVES) as child:
        child.start(lambda: "ready" in child.output())
        assert child.running
        assert child in live_children()
        assert child.pid is not None
    assert not child.running
    assert child not in live_children()


def test_output_only_shows_what_the_latest_spawn_wrote(tmp_path: Path) -> None:
    child = _python(tmp_path, SERVES)
    child.start(lambda: "ready" in child.output())
    child.stop()
    child.log_path.write_text("left over from an earlier run\n")
    child.start(lambda: "ready" in child.output())
    try:
        assert child.output() == "ready\n"
    finally:
        child.stop()


def test_stop_is_idempotent_and_harmless_before_spawn(tmp_path: Path) -> None:
    child = _python(tmp_path, SERVES)
    child.stop()
    child.start(lambda: "ready" in child.output())
    child.stop()
    child.stop()
    assert not child.running
    assert child.pid is None


def test_stop_kills_a_child_that_ignores_the_polite_signal(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    child = _python(tmp_path, code)
    child.start(lambda: "ready" in child.output())
    child.stop(timeout=0.2)
    assert not child.running


def test_the_default_error_family_is_sapo_error(tmp_path: Path) -> None:
    child = ChildProcess(
        "quitter", [sys.executable, "-c", "raise SystemExit(1)"], tmp_path / "q.log"
    )
    with pytest.raises(SapoError, match="quitter exited"):
        child.start(lambda: False)


def test_the_stop_signal_is_configurable(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: (print('got SIGINT', flush=True), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = ChildProcess(
        "anvil-like",
        [sys.executable, "-c", code],
        tmp_path / "a.log",
        stop_signal=signal.SIGINT,
    )
    child.start(lambda: "ready" in child.output())
    child.stop()
    assert "got SIGINT" in child.output()


@pytest.mark.anyio
async def test_async_callers_wait_on_the_same_readiness_loop(tmp_path: Path) -> None:
    child = _python(tmp_path, SERVES)
    child.spawn()
    try:
        await child.wait_ready_async(lambda: "ready" in child.output(), timeout=20)
        assert child.running
    finally:
        child.stop()
    failing = _python(tmp_path, "raise SystemExit(2)", name="async-quitter")
    failing.spawn()
    with pytest.raises(TransportUnavailable, match="async-quitter exited with code 2"):
        await failing.wait_ready_async(lambda: False)


def test_free_port_is_bindable_and_port_open_sees_a_listener() -> None:
    port = free_port()
    assert not port_open("127.0.0.1", port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert port_open("127.0.0.1", port)


@pytest.mark.skipif(
    not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux's port range"
)
def test_lasting_ports_are_distinct_bindable_and_never_a_source_port() -> None:
    """A server stopped and started again on its port must not find it taken as an outgoing
    connection's source port (the chaos run's NATS router, 2026-12-07): lasting ports sit
    below the range the kernel draws source ports from."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = lasting_ports(12)
    assert len(set(ports)) == 12
    assert all(1024 <= p < low for p in ports)
    for port in ports:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))
