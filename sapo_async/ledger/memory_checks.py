"""The memory ledger's stateless checks of a commitment's arguments.

Owns what ``SapoLedger`` checks of a ``CommitmentInput`` without reading its storage (the
usage list's shape: ``SapoLedger._checkUsage``) and what web3 would refuse to encode (ABI
widths), raising the same :class:`~sapo_async.errors.CommitmentRejected` reasons (or
:class:`~sapo_async.errors.LedgerError`) as the EVM backend. The rules that read state
(registration, round order, credit, nonces) stay in :mod:`sapo_async.ledger.memory`; the
relayed signature's check (``SapoLedger._checkSigner``) is here too.
"""

from __future__ import annotations

from sapo_async.errors import LedgerError
from sapo_async.ledger.chain import reverted
from sapo_async.ledger.signing import TypedData, recover_signer_or_none
from sapo_async.ledger.types import MAX_PRODUCERS, CommitmentPayload, checksum

__all__ = ["check_abi_widths", "check_signer", "check_usage"]

_ZERO_ROOT = bytes(32)
_UINT = {"uint64": 2**64 - 1, "uint32": 2**32 - 1}
_SIGNATURE_BYTES = 65


def check_signer(node: str, data: TypedData, signature: bytes) -> None:
    """``SapoLedger._checkSigner``: ``signature`` of ``data`` was made by ``node``'s key."""
    if len(signature) != _SIGNATURE_BYTES:
        raise reverted("ECDSAInvalidSignatureLength", length=len(signature))
    signer = recover_signer_or_none(data, signature)
    if signer is None:
        raise reverted("ECDSAInvalidSignature")
    if signer != node:
        raise reverted("SapoLedgerInvalidSigner", signer=signer, node=node)


def check_usage(node: str, c: CommitmentPayload) -> list[str]:
    """``SapoLedger._checkUsage``; returns the producers checksummed."""
    n = len(c.producers)
    if n != len(c.counts) or n != len(c.producer_rounds):
        raise reverted(
            "SapoLedgerUsageLengthMismatch",
            producers=n,
            producerRounds=len(c.producer_rounds),
            counts=len(c.counts),
        )
    if n > MAX_PRODUCERS:
        raise reverted("SapoLedgerTooManyProducers", producers=n, max=MAX_PRODUCERS)
    producers = [checksum(p) for p in c.producers]
    previous, previous_round = "0x" + "00" * 20, 0
    for i, (producer, producer_round, count) in enumerate(
        zip(producers, c.producer_rounds, c.counts, strict=True)
    ):
        key, last = int(producer, 16), int(previous, 16)
        if key == 0 or key < last or (i and key == last and producer_round <= previous_round):
            raise reverted("SapoLedgerProducersNotSorted", previous=previous, producer=producer)
        if producer == node:
            raise reverted("SapoLedgerSelfUsage", node=node)
        if count == 0:
            raise reverted("SapoLedgerZeroUsage", producer=producer)
        previous, previous_round = producer, producer_round
    if sum(c.counts) != c.external_count:
        raise reverted(
            "SapoLedgerUsageSumMismatch", sum=sum(c.counts), externalCount=c.external_count
        )
    return producers


def check_abi_widths(c: CommitmentPayload) -> None:
    """Refuse what web3 could not encode into ``CommitmentInput`` (the EVM backend's
    equivalent is a web3 validation error, translated to :class:`LedgerError`)."""
    fields = [
        ("round", c.round, "uint64"),
        ("policyVersion", c.policy_version, "uint64"),
        ("rolloutCount", c.rollout_count, "uint32"),
        ("externalCount", c.external_count, "uint32"),
        *(("producerRounds", r, "uint64") for r in c.producer_rounds),
        *(("counts", n, "uint32") for n in c.counts),
    ]
    for name, value, kind in fields:
        if not 0 <= value <= _UINT[kind]:
            raise LedgerError(f"{name}={value} does not fit {kind}")
    for name, root in (("rolloutRoot", c.rollout_root), ("externalRoot", c.external_root)):
        if len(root) != len(_ZERO_ROOT):
            raise LedgerError(f"{name} is {len(root)} bytes, not 32")
