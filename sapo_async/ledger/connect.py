"""One-call ways to get a ledger client: a fresh embedded ledger, or an existing one by URL.

Owns the defaults a swarm wants: the embedded chain gets a funded relayer that sends every
node's commitments with their EIP-712 signatures, so node keys never need funds.
"""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.ledger.deploy import deploy_ledger, fund
from sapo_async.ledger.embedded import embedded_chain
from sapo_async.ledger.evm import EvmLedger
from sapo_async.ledger.rpc import rpc_chain

__all__ = ["connect_ledger", "open_embedded_ledger"]


async def open_embedded_ledger(swarm: str = "local") -> EvmLedger:
    """Start an in-process chain, deploy a ``SapoLedger`` for ``swarm``, return its client.

    The client's relayer is a fresh funded account: pass node accounts without funds to
    :meth:`EvmLedger.register` / :meth:`EvmLedger.submit` (or a :class:`Recorder`).
    """
    chain = embedded_chain()
    relayer: LocalAccount = Account.create()
    await fund(chain, relayer.address)
    return await deploy_ledger(chain, relayer, swarm, relayer=relayer)


def connect_ledger(
    rpc_url: str, address: str, *, relayer_key: str | None = None, from_block: int = 0
) -> EvmLedger:
    """A client of the ``SapoLedger`` at ``address`` on the chain at ``rpc_url``.

    Args:
        rpc_url: JSON-RPC endpoint (anvil, testnet, L2).
        address: the deployed ledger.
        relayer_key: private key of an account that pays for nodes' transactions; None
            means each node sends (and pays for) its own.
        from_block: the deployment block, where event scans start.

    Raises:
        ConfigError: ``rpc_url`` is not http(s).
        RejectedInput: ``address`` is not an address.
    """
    relayer = Account.from_key(relayer_key) if relayer_key else None
    return EvmLedger(rpc_chain(rpc_url), address, relayer=relayer, from_block=from_block)
