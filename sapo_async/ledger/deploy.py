"""Deploying the ledger (and the benchmark's naive baseline), and funding dev accounts.

Owns contract creation from the build artifacts and the swarm id convention
(``keccak256(swarm name)``). Funding uses the chain's first unlocked account, which only dev
chains (eth-tester, anvil) have.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import Wei

from sapo_async.errors import LedgerError
from sapo_async.ledger.artifacts import load_artifact
from sapo_async.ledger.chain import Chain
from sapo_async.ledger.evm import EvmLedger
from sapo_async.wire.rollout import keccak256

__all__ = ["Deployment", "deploy_contract", "deploy_ledger", "fund", "swarm_id"]


def swarm_id(swarm: str) -> bytes:
    """The 32-byte id a ledger stores for swarm ``swarm``: ``keccak256(utf-8 name)``."""
    return keccak256(swarm.encode())


@dataclass(frozen=True, slots=True)
class Deployment:
    """Where a contract was deployed."""

    address: str
    block_number: int
    tx_hash: str
    gas_used: int


async def deploy_contract(
    chain: Chain, deployer: LocalAccount, name: str, *args: object
) -> Deployment:
    """Deploy artifact ``name`` with constructor ``args``, sent and paid by ``deployer``.

    Raises:
        LedgerUnavailable: the chain cannot be reached.
        LedgerError: the deployment failed.
    """
    artifact = load_artifact(name)

    def send() -> Deployment:
        factory = chain.w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
        receipt = chain.send_sync(deployer, factory.constructor(*args))
        address = receipt.contract_address
        if not address:
            raise LedgerError(f"deploying {name} created no contract (tx {receipt.tx_hash})")
        return Deployment(str(address), receipt.block_number, receipt.tx_hash, receipt.gas_used)

    return await chain.run(send)


async def deploy_ledger(
    chain: Chain, deployer: LocalAccount, swarm: str, *, relayer: LocalAccount | None = None
) -> EvmLedger:
    """Deploy a ``SapoLedger`` for ``swarm`` and return a client of it.

    Args:
        chain: where to deploy.
        deployer: pays for the deployment.
        swarm: the swarm's name (the contract stores ``swarm_id(swarm)``).
        relayer: the returned client's relayer (see :class:`EvmLedger`); defaults to none.
    """
    deployment = await deploy_contract(chain, deployer, "SapoLedger", swarm_id(swarm))
    return EvmLedger(chain, deployment.address, relayer=relayer, from_block=deployment.block_number)


async def fund(chain: Chain, address: str, wei: int = 10**20) -> None:
    """Send ``wei`` to ``address`` from the chain's first unlocked dev account.

    Raises:
        LedgerError: the chain has no unlocked account (not a dev chain).
    """

    def send() -> None:
        accounts = chain.w3.eth.accounts
        if not accounts:
            raise LedgerError("chain has no unlocked dev account to fund from")
        tx_hash = chain.w3.eth.send_transaction(
            {"from": accounts[0], "to": Web3.to_checksum_address(address), "value": Wei(wei)}
        )
        chain.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.05)

    await chain.run(send)
