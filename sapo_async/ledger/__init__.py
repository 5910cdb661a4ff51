"""The ledger port: signed rollout commitments on an EVM chain, and audit reads.

Pieces: :mod:`.merkle` (pure trees and proofs), :mod:`.types` (RoundCommitment and what the
chain reports), :mod:`.base` (the ``Ledger`` protocol), :mod:`.evm` (web3 adapter),
:mod:`.embedded` (in-process EVM, the default), :mod:`.rpc` (JSON-RPC URL), :mod:`.deploy`,
:mod:`.signing` (EIP-712), :mod:`.connect` (one-call clients), :mod:`.anvil` (devnet
runner). The recorder (journal + retries) lives in :mod:`sapo_async.recorder`, the audit in
:mod:`sapo_async.audit`.
"""

from __future__ import annotations

from sapo_async.ledger.base import Ledger
from sapo_async.ledger.connect import connect_ledger, open_embedded_ledger
from sapo_async.ledger.deploy import Deployment, deploy_contract, deploy_ledger, fund, swarm_id
from sapo_async.ledger.embedded import embedded_chain
from sapo_async.ledger.evm import Chain, EvmLedger
from sapo_async.ledger.merkle import MerkleTree, merkle_root, verify_proof
from sapo_async.ledger.rpc import rpc_chain
from sapo_async.ledger.types import (
    CommitmentPayload,
    NodeStats,
    OnChainCommitment,
    RoundCommitment,
    SubmitReceipt,
    UsageCredit,
)

__all__ = [
    "Chain",
    "CommitmentPayload",
    "Deployment",
    "EvmLedger",
    "Ledger",
    "MerkleTree",
    "NodeStats",
    "OnChainCommitment",
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
