"""The process-wide embedded services a swarm's nodes share: one NATS server, one EVM.

Owns starting, sharing and stopping them. With no NATS URL the first node of a process
starts a private ``nats-server`` (JetStream, free loopback port, temporary store) and every
later node of that process shares it; with no RPC URL the first node of a swarm starts an
in-process EVM and deploys the swarm's ledger contract, shared the same way, with the
nodes' journals in one temporary directory. Reference counts decide: the last node to
release a service stops it.

Deliberately does not know nodes: :mod:`.swarm` acquires and releases for them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from sapo_async.logs import get_logger

__all__ = ["EMBEDDED", "LedgerHandle", "embedded_ledger"]

_log = get_logger("swarm")


@dataclass
class LedgerHandle:
    """A swarm's ledger as the nodes of this process share it.

    Attributes:
        ledger: the contract client (an :class:`~sapo_async.ledger.EvmLedger`).
        journal_dir: where node journals live.
    """

    ledger: Any
    journal_dir: Path


class _Embedded:
    """Process-wide embedded services, shared by the nodes of this process (refcounted)."""

    def __init__(self) -> None:
        self.nats: Any = None
        self.nats_users = 0
        self.ledgers: dict[str, LedgerHandle] = {}
        self.ledger_users: dict[str, int] = {}
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.lock = anyio.Lock()

    async def acquire_nats(self) -> str:
        from sapo_async.fabric.transport.embedded import EmbeddedNats

        async with self.lock:
            if self.nats is None:
                server = EmbeddedNats()
                await server.start()
                self.nats = server
                _log.info("embedded_nats_started", url=server.url)
            self.nats_users += 1
            return str(self.nats.url)

    async def release_nats(self) -> None:
        async with self.lock:
            self.nats_users -= 1
            if self.nats_users == 0 and self.nats is not None:
                server, self.nats = self.nats, None
                with anyio.CancelScope(shield=True):
                    await server.aclose()

    async def acquire_ledger(self, swarm: str) -> LedgerHandle:
        from sapo_async.ledger.connect import open_embedded_ledger

        async with self.lock:
            if swarm not in self.ledgers:
                ledger = await open_embedded_ledger(swarm)
                if self.tmp is None:
                    self.tmp = tempfile.TemporaryDirectory(prefix="sapo-journal-")
                self.ledgers[swarm] = LedgerHandle(ledger, Path(self.tmp.name) / swarm)
                _log.info("embedded_ledger_deployed", swarm=swarm, address=ledger.address)
            self.ledger_users[swarm] = self.ledger_users.get(swarm, 0) + 1
            return self.ledgers[swarm]

    async def release_ledger(self, swarm: str) -> None:
        async with self.lock:
            self.ledger_users[swarm] -= 1
            if self.ledger_users[swarm] == 0:
                del self.ledgers[swarm]
                del self.ledger_users[swarm]
                if not self.ledgers and self.tmp is not None:
                    self.tmp.cleanup()
                    self.tmp = None


EMBEDDED = _Embedded()
"""The embedded services of this process."""


def embedded_ledger(swarm: str) -> LedgerHandle | None:
    """The embedded ledger of ``swarm`` in this process, if a node holds one (audits)."""
    return EMBEDDED.ledgers.get(swarm)
