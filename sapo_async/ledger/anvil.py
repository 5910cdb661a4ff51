"""Run a local anvil chain (npm ``@foundry-rs/anvil``) for devnets, benchmarks and tests.

Owns finding the binary (the one finder), starting anvil on a free (or given) loopback
port, optionally with an on-disk state file so a restart keeps the chain, waiting until it
answers ``eth_chainId``, setting balances (``anvil_setBalance``) and stopping it with SIGINT,
which makes anvil dump its state, then SIGKILL past the deadline. The child process itself
is :class:`sapo_async.process.ChildProcess`. Knows nothing about the contracts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sapo_async.errors import ConfigError, LedgerError, LedgerUnavailable
from sapo_async.limits import SERVER_START_TIMEOUT_S, SERVER_STOP_TIMEOUT_S
from sapo_async.process import ChildProcess, free_port

__all__ = ["ANVIL_DEV_ADDRESS", "ANVIL_DEV_KEY", "AnvilProcess", "find_anvil"]

ANVIL_DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
"""anvil's first development account (public knowledge, funded only on local devnets):
derived from anvil's default mnemonic "test test ... junk". Never use it on a real chain."""

ANVIL_DEV_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
"""The address of :data:`ANVIL_DEV_KEY`."""

_REPO_ROOT = Path(__file__).resolve().parents[2]


def find_anvil(start: Path | None = None) -> Path:
    """Locate anvil: ``$SAPO_ANVIL``, then npm's install above ``start`` (default: the
    working directory) or beside this package, then ``PATH``.

    Under ``node_modules`` the native binary is preferred over ``.bin/anvil`` (a node
    wrapper), so that signals reach anvil itself.

    Raises:
        ConfigError: no anvil binary was found (run ``npm ci``).
    """
    env = os.environ.get("SAPO_ANVIL")
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents, _REPO_ROOT):
        modules = folder / "node_modules"
        for native in sorted(modules.glob("@foundry-rs/anvil-*/bin/anvil")):
            if os.access(native, os.X_OK):
                return native
        if (modules / ".bin" / "anvil").exists():
            return modules / ".bin" / "anvil"
    found = shutil.which("anvil")
    if found:
        return Path(found)
    raise ConfigError(
        "anvil not found: run `npm ci` in the repository (it installs @foundry-rs/anvil), "
        "install Foundry, or set SAPO_ANVIL",
        field="ledger.rpc_url",
    )


def _rpc(url: str, method: str, params: list[Any] | None = None, timeout: float = 2.0) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(  # noqa: S310 - our own http:// loopback URL
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        reply = json.loads(response.read())
    if "error" in reply:
        raise LedgerError(f"{method} failed: {reply['error']}")
    return reply["result"]


class AnvilProcess:
    """One anvil on a fixed port, restartable (with its chain, when ``keep_state``).

    Args:
        workdir: folder for the log and the state file.
        port: TCP port (a free one by default); kept across restarts.
        host: interface to listen on.
        chain_id: the chain id it reports (anvil's default, 31337).
        keep_state: load and dump ``workdir/anvil-state.json`` so a restart keeps the chain.
        binary: the anvil executable (found with :func:`find_anvil` by default).
        block_time_s: mine a block every this many seconds (a real chain's pace: 1-2 s on
            an L2, 12 s on Ethereum); None mines one block per transaction at once.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        chain_id: int = 31337,
        keep_state: bool = True,
        binary: Path | None = None,
        block_time_s: float | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.block_time_s = block_time_s
        self.host = host
        self.port = port or free_port(host)
        self.chain_id = chain_id
        self.url = f"http://{host}:{self.port}"
        self.state: Path | None = self.workdir / "anvil-state.json" if keep_state else None
        self.log = self.workdir / "anvil.log"
        self._binary = binary
        self.process: ChildProcess | None = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.running

    def start(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        """Start anvil (loading its state file if there is one) and wait until it answers.

        Raises:
            ConfigError: no anvil binary.
            LedgerUnavailable: anvil exited or did not answer within ``timeout_s``.
        """
        argv = [str(self._binary or find_anvil()), "--host", self.host, "--port", str(self.port)]
        argv += ["--chain-id", str(self.chain_id)]
        if self.block_time_s is not None:  # mine on a clock, like a real chain, not per tx
            argv += ["--block-time", f"{self.block_time_s:g}"]
        if self.state is not None:
            argv += ["--state", str(self.state), "--preserve-historical-states"]
        self.process = ChildProcess(
            "anvil", argv, self.log, error=LedgerUnavailable, stop_signal=signal.SIGINT
        )
        self.process.start(self._answers, timeout=timeout_s, what=f"RPC on {self.url}")

    def _answers(self) -> bool:
        try:
            return int(_rpc(self.url, "eth_chainId", timeout=1.0), 16) == self.chain_id
        except (OSError, urllib.error.URLError, ValueError, LedgerError):
            return False

    def set_balance(self, address: str, wei: int) -> None:
        """Give ``address`` exactly ``wei`` (anvil's ``anvil_setBalance``), e.g. gas for a node.

        Raises:
            LedgerError: anvil refused.
            LedgerUnavailable: anvil cannot be reached.
        """
        try:
            _rpc(self.url, "anvil_setBalance", [address, hex(wei)])
        except (OSError, urllib.error.URLError) as exc:
            raise LedgerUnavailable(f"cannot reach anvil at {self.url}: {exc}") from exc

    def stop(self, timeout_s: float = SERVER_STOP_TIMEOUT_S) -> None:
        """Stop gracefully (anvil dumps its state on SIGINT), kill after ``timeout_s``;
        idempotent."""
        if self.process is not None:
            self.process.stop(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
