"""The ledger port: signed rollout commitments on an EVM chain, and audit reads.

Pieces: :mod:`.merkle` (pure trees and proofs), :mod:`.types` (RoundCommitment and what the
chain reports), :mod:`.base` (the ``Ledger`` protocol), :mod:`.memory` (the contract's rules
without an EVM), :mod:`.evm` (web3 adapter) over :mod:`.chain` (web3 connection and error
translation), :mod:`.embedded` (in-process EVM, the default), :mod:`.rpc` (JSON-RPC URL),
:mod:`.deploy`, :mod:`.signing` (EIP-712), :mod:`.connect` (one-call clients), :mod:`.anvil`
(devnet runner). The recorder (journal + retries) lives in :mod:`sapo_async.ledger.recorder`,
the audit in :mod:`sapo_async.ledger.audit`.

Names load on first use (:mod:`sapo_async._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports

if TYPE_CHECKING:
    from sapo_async.ledger.base import Ledger
    from sapo_async.ledger.chain import Chain
    from sapo_async.ledger.connect import connect_ledger, open_embedded_ledger
    from sapo_async.ledger.deploy import Deployment, deploy_contract, deploy_ledger, fund, swarm_id
    from sapo_async.ledger.embedded import embedded_chain
    from sapo_async.ledger.evm import EvmLedger
    from sapo_async.ledger.memory import MemoryLedger
    from sapo_async.ledger.merkle import MerkleTree, merkle_root, verify_proof
    from sapo_async.ledger.rpc import rpc_chain
    from sapo_async.ledger.types import (
        CommitmentPayload,
        OnChainCommitment,
        OnChainTotals,
        RoundCommitment,
        SubmitReceipt,
        UsageCredit,
    )

_LAZY = {
    "Chain": "sapo_async.ledger.chain",
    "CommitmentPayload": "sapo_async.ledger.types",
    "Deployment": "sapo_async.ledger.deploy",
    "EvmLedger": "sapo_async.ledger.evm",
    "Ledger": "sapo_async.ledger.base",
    "MemoryLedger": "sapo_async.ledger.memory",
    "MerkleTree": "sapo_async.ledger.merkle",
    "OnChainCommitment": "sapo_async.ledger.types",
    "OnChainTotals": "sapo_async.ledger.types",
    "RoundCommitment": "sapo_async.ledger.types",
    "SubmitReceipt": "sapo_async.ledger.types",
    "UsageCredit": "sapo_async.ledger.types",
    "connect_ledger": "sapo_async.ledger.connect",
    "deploy_contract": "sapo_async.ledger.deploy",
    "deploy_ledger": "sapo_async.ledger.deploy",
    "embedded_chain": "sapo_async.ledger.embedded",
    "fund": "sapo_async.ledger.deploy",
    "merkle_root": "sapo_async.ledger.merkle",
    "open_embedded_ledger": "sapo_async.ledger.connect",
    "rpc_chain": "sapo_async.ledger.rpc",
    "swarm_id": "sapo_async.ledger.deploy",
    "verify_proof": "sapo_async.ledger.merkle",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "Chain",
    "CommitmentPayload",
    "Deployment",
    "EvmLedger",
    "Ledger",
    "MemoryLedger",
    "MerkleTree",
    "OnChainCommitment",
    "OnChainTotals",
    "RoundCommitment",
    "SubmitReceipt",
    "UsageCredit",
    "connect_ledger",
    "deploy_contract",
    "deploy_ledger",
    "embedded_chain",
    "fund",
    "merkle_root",
    "open_embedded_ledger",
    "rpc_chain",
    "swarm_id",
    "verify_proof",
]
