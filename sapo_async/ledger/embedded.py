"""The embedded ledger backend: an in-process EVM (eth-tester + py-evm), the default.

Owns creating the in-memory chain. Its state lives and dies with the process, which is what
a local swarm and the tests want; use :mod:`sapo_async.ledger.rpc` for a chain that outlives
the process (anvil with ``--state``, a testnet).
"""

from __future__ import annotations

from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

from sapo_async.ledger.chain import Chain

__all__ = ["embedded_chain"]


def embedded_chain() -> Chain:
    """Start a fresh in-process chain (auto-mining; ten funded, unlocked dev accounts)."""
    return Chain(Web3(EthereumTesterProvider()), kind="embedded")
