"""``sapo-async devnet``: a swarm's servers on one machine, composed from the ports' pieces.

Owns :class:`Devnet` (NATS with JetStream, anvil, the ledger deployed for a swarm, and the
``node.toml`` lines that reach them) and :func:`run_devnet`, which runs one until a signal.
Every piece is the ports' own: nats-server from
:func:`~sapo_async.fabric.transport.server.spawn_nats_server`, anvil from
:class:`~sapo_async.ledger.anvil.AnvilProcess`, the deployment from
:func:`~sapo_async.ledger.deploy.deploy_ledger` with anvil's first development key.

Invariants: a devnet that fails to start leaves no server running; ``stop()`` (or leaving
the ``with`` block) stops anvil, then NATS, and is idempotent; nothing listens beyond
loopback.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from sapo_async.errors import TransportUnavailable
from sapo_async.fabric.transport.server import NatsServer, spawn_nats_server
from sapo_async.ledger.anvil import ANVIL_DEV_ADDRESS, ANVIL_DEV_KEY, AnvilProcess
from sapo_async.process import StopOnExit

__all__ = ["ANVIL_DEV_ADDRESS", "ANVIL_DEV_KEY", "Devnet", "run_devnet", "start_devnet"]

_FUNDING_WEI = 100 * 10**18
"""Each ``--fund`` address gets 100 ETH: gas for years of a node's own commitments."""


@dataclass
class Devnet(StopOnExit):
    """What ``sapo-async devnet`` runs: NATS with JetStream, anvil, and the deployed ledger.

    Attributes:
        nats: the NATS server.
        anvil: the chain.
        swarm: the swarm name the contract was deployed for.
        contract_address: the ledger's address.
    """

    nats: NatsServer
    anvil: AnvilProcess
    swarm: str
    contract_address: str

    def node_settings(self) -> str:
        """The TOML a node needs to join this devnet."""
        return (
            "# settings for a node on this devnet (paste into node.toml)\n"
            f'[node]\nswarm = "{self.swarm}"\n\n'
            f'[nats]\nurls = ["{self.nats.url}"]\n\n'
            f'[ledger]\nrpc_url = "{self.anvil.url}"\n'
            f'contract_address = "{self.contract_address}"\n'
            f"chain_id = {self.anvil.chain_id}\n"
        )

    @property
    def running(self) -> bool:
        """Whether both servers are alive."""
        return self.nats.process.running and self.anvil.running

    def stop(self) -> None:
        """Stop anvil and NATS (reverse order of start); idempotent."""
        self.anvil.stop()
        self.nats.stop()


async def _deploy(rpc_url: str, swarm: str) -> str:
    from eth_account import Account

    from sapo_async.ledger.deploy import deploy_ledger
    from sapo_async.ledger.rpc import rpc_chain

    ledger = await deploy_ledger(rpc_chain(rpc_url), Account.from_key(ANVIL_DEV_KEY), swarm)
    return ledger.address


def start_devnet(
    work_dir: Path,
    *,
    swarm: str = "devnet",
    nats_port: int = 0,
    anvil_port: int = 0,
    fund: Sequence[str] = (),
) -> Devnet:
    """Start NATS (JetStream) and anvil, fund addresses and deploy the ledger for ``swarm``.

    Args:
        work_dir: JetStream store and server logs.
        swarm: the swarm name (the contract's constructor argument).
        nats_port, anvil_port: 0 picks free ports.
        fund: addresses to give 100 ETH each (gas for nodes' own commitments).

    Returns:
        The running devnet; the caller stops it.

    Raises:
        ConfigError: nats-server or anvil is not installed.
        TransportUnavailable: nats-server did not start.
        LedgerUnavailable, LedgerError: anvil did not start, or the deployment failed.
    """
    nats = spawn_nats_server(work_dir / "nats", port=nats_port, name="devnet").wait_ready()
    with contextlib.ExitStack() as on_error:
        on_error.callback(nats.stop)
        anvil = AnvilProcess(work_dir / "anvil", port=anvil_port or None, keep_state=False)
        on_error.callback(anvil.stop)
        anvil.start()
        for address in fund:
            anvil.set_balance(address, _FUNDING_WEI)
        contract_address = anyio.run(_deploy, anvil.url, swarm)
        on_error.pop_all()  # started: from here on the caller stops it
    return Devnet(nats=nats, anvil=anvil, swarm=swarm, contract_address=contract_address)


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

    Raises:
        TransportUnavailable: a server exited while the devnet ran.
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
                if not devnet.running:
                    raise TransportUnavailable("a devnet server exited unexpectedly")
            echo("devnet stopping")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
