"""EIP-712 messages a node signs so that any relayer can send its commitment or registration.

Owns the typed-data layout, which must equal ``SapoLedger.COMMITMENT_TYPEHASH`` and
``REGISTRATION_TYPEHASH`` field for field (a test compares the digest with the contract's
``commitmentDigest``). The domain is ``("SapoLedger", "1", chain id, ledger address)``, so a
signature is bound to one chain and one deployment; the per-node nonce makes it single-use.
"""

from __future__ import annotations

from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_keys.exceptions import BadSignature

from sapo_async.ledger.types import CommitmentPayload
from sapo_async.wire.rollout import keccak256

__all__ = [
    "COMMITMENT_TYPES",
    "REGISTRATION_TYPES",
    "TypedData",
    "commitment_typed_data",
    "recover_signer_or_none",
    "registration_typed_data",
    "sign_commitment",
    "sign_registration",
    "typed_digest",
]

TypedData = tuple[dict[str, Any], dict[str, list[dict[str, str]]], dict[str, Any]]
"""``(domain, types, message)`` as ``eth_account``'s typed-data functions take them."""

COMMITMENT_TYPES: dict[str, list[dict[str, str]]] = {
    "Commitment": [
        {"name": "node", "type": "address"},
        {"name": "round", "type": "uint64"},
        {"name": "policyVersion", "type": "uint64"},
        {"name": "rolloutRoot", "type": "bytes32"},
        {"name": "rolloutCount", "type": "uint32"},
        {"name": "externalRoot", "type": "bytes32"},
        {"name": "externalCount", "type": "uint32"},
        {"name": "producers", "type": "address[]"},
        {"name": "producerRounds", "type": "uint64[]"},
        {"name": "counts", "type": "uint32[]"},
        {"name": "nonce", "type": "uint256"},
    ]
}

REGISTRATION_TYPES: dict[str, list[dict[str, str]]] = {
    "Registration": [
        {"name": "node", "type": "address"},
        {"name": "metadata", "type": "string"},
        {"name": "nonce", "type": "uint256"},
    ]
}


def _domain(chain_id: int, ledger: str) -> dict[str, Any]:
    return {"name": "SapoLedger", "version": "1", "chainId": chain_id, "verifyingContract": ledger}


def commitment_typed_data(
    chain_id: int, ledger: str, node: str, payload: CommitmentPayload, nonce: int
) -> TypedData:
    """Return ``(domain, types, message)`` of a relayed commitment."""
    message = {
        "node": node,
        "round": payload.round,
        "policyVersion": payload.policy_version,
        "rolloutRoot": payload.rollout_root,
        "rolloutCount": payload.rollout_count,
        "externalRoot": payload.external_root,
        "externalCount": payload.external_count,
        "producers": list(payload.producers),
        "producerRounds": list(payload.producer_rounds),
        "counts": list(payload.counts),
        "nonce": nonce,
    }
    return _domain(chain_id, ledger), COMMITMENT_TYPES, message


def sign_commitment(
    account: LocalAccount, chain_id: int, ledger: str, payload: CommitmentPayload, nonce: int
) -> bytes:
    """Sign ``payload`` as ``account`` for relaying; returns the 65-byte ``r || s || v``."""
    return _sign(account, commitment_typed_data(chain_id, ledger, account.address, payload, nonce))


def registration_typed_data(
    chain_id: int, ledger: str, node: str, metadata: str, nonce: int
) -> TypedData:
    """Return ``(domain, types, message)`` of a relayed registration."""
    message = {"node": node, "metadata": metadata, "nonce": nonce}
    return _domain(chain_id, ledger), REGISTRATION_TYPES, message


def sign_registration(
    account: LocalAccount, chain_id: int, ledger: str, metadata: str, nonce: int
) -> bytes:
    """Sign a registration of ``account`` with ``metadata`` for relaying (65 bytes)."""
    return _sign(
        account, registration_typed_data(chain_id, ledger, account.address, metadata, nonce)
    )


def _sign(account: LocalAccount, data: TypedData) -> bytes:
    return bytes(Account.sign_typed_data(account.key, *data).signature)


def typed_digest(data: TypedData) -> bytes:
    """The EIP-712 digest of ``data``: what is signed (``_hashTypedDataV4`` on chain)."""
    signable = encode_typed_data(*data)
    return keccak256(b"\x19" + signable.version + signable.header + signable.body)


def recover_signer_or_none(data: TypedData, signature: bytes) -> str | None:
    """The checksummed address that made ``signature`` over ``data``.

    Returns:
        The signer, or None when ``signature`` is not a recoverable 65-byte ``r || s || v``
        signature (where the contract's ``ECDSA.recover`` reverts).
    """
    try:
        return str(Account.recover_message(encode_typed_data(*data), signature=signature))
    except (BadSignature, ValueError, TypeError):
        return None
