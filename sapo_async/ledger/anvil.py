"""Run a local anvil devnet (npm ``@foundry-rs/anvil``) for the swarm, benchmarks and tests.

Owns finding the binary, choosing a free port, starting anvil with an on-disk state file
(so a restart keeps the chain), waiting until it answers JSON-RPC, and stopping it gracefully
(SIGINT, which makes anvil dump its state) with a kill after a timeout. Knows nothing about
the contracts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from sapo_async.errors import ConfigError, LedgerUnavailable

__all__ = ["ANVIL_DEV_KEY", "AnvilProcess", "find_anvil", "free_port"]

ANVIL_DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
"""anvil's first default dev key: public knowledge, funded only on local devnets."""

_START_TIMEOUT_S = 30.0
"""anvil answers within ~0.2 s here; 30 s covers a cold, loaded CI machine."""


def find_anvil(start: Path | None = None) -> Path:
    """Locate anvil: ``$SAPO_ANVIL``, then ``node_modules/.bin/anvil`` above ``start``, then PATH.

    Raises:
        ConfigError: no anvil binary was found (run ``npm ci``).
    """
    env = os.environ.get("SAPO_ANVIL")
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "node_modules" / ".bin" / "anvil"
        if candidate.exists():
            return candidate
    module_root = Path(__file__).resolve().parents[2] / "node_modules" / ".bin" / "anvil"
    if module_root.exists():
        return module_root
    found = shutil.which("anvil")
    if found:
        return Path(found)
    raise ConfigError("anvil not found: run `npm ci` or set SAPO_ANVIL", field="ledger.anvil")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AnvilProcess:
    """One anvil on a fixed port, restartable with its chain state.

    Args:
        workdir: folder for the state file and the log.
        port: TCP port (a free one by default); kept across restarts.
        binary: the anvil executable (found with :func:`find_anvil` by default).
    """

    def __init__(
        self, workdir: Path, *, port: int | None = None, binary: Path | None = None
    ) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = self.workdir / "anvil-state.json"
        self.log = self.workdir / "anvil.log"
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Start anvil (loading its state file if present) and wait until it answers.

        Raises:
            ConfigError: no anvil binary.
            LedgerUnavailable: anvil exited or did not answer within ``timeout_s``.
        """
        binary = self._binary or find_anvil()
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [str(binary), "--port", str(self.port), "--host", "127.0.0.1"]
        argv += ["--state", str(self.state), "--preserve-historical-states"]
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise LedgerUnavailable(f"anvil exited with {self._proc.returncode}: {tail}")
            if self._answers():
                return
            time.sleep(0.05)
        self.stop()
        raise LedgerUnavailable(f"anvil did not answer on {self.url} within {timeout_s} s")

    def _answers(self) -> bool:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})
        request = urllib.request.Request(  # noqa: S310 - a fixed http://127.0.0.1 URL
            self.url, data=body.encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=1) as response:  # noqa: S310
                return b"result" in response.read()
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop gracefully (anvil dumps its state on SIGINT); kill after ``timeout_s``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> AnvilProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
