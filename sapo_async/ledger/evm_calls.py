"""How the EVM ledger builds a node's commitment calls: direct or relayed, one or a batch.

Owns choosing the contract function (``commit``, ``commitMany``, ``commitBySig``,
``commitManyBySig``), a gasless node's signatures of a relayed batch (one per round, with
consecutive nonces, so every prefix of the batch is a valid batch too), the gas headroom of
a batch's usage entries, and splitting one batch receipt into one receipt per round. It sends
nothing: :mod:`sapo_async.ledger.evm` does, through the chain's lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from eth_account.signers.local import LocalAccount

from sapo_async import limits
from sapo_async.ledger.signing import sign_commitment
from sapo_async.ledger.types import CommitmentPayload, SubmitReceipt

__all__ = ["Signed", "batch_call", "headroom", "per_round", "sign_batch"]

Signed = tuple[int, list[bytes]]
"""A relayed batch's first nonce and the node's signature of each commitment."""


def headroom(payloads: Sequence[CommitmentPayload]) -> int:
    """Gas above the estimate: a usage entry simulated as a claim may land as a credit."""
    return limits.LEDGER_GAS_HEADROOM_PER_USAGE * sum(len(p.producers) for p in payloads)


def sign_batch(
    node: LocalAccount,
    chain_id: int,
    ledger: str,
    nonce: int,
    payloads: Sequence[CommitmentPayload],
) -> Signed:
    """``node``'s EIP-712 signatures of ``payloads`` with nonces ``nonce``, ``nonce + 1``, ..."""
    return nonce, [
        sign_commitment(node, chain_id, ledger, p, nonce + i) for i, p in enumerate(payloads)
    ]


def batch_call(
    fns: Any, node: str, payloads: Sequence[CommitmentPayload], signed: Signed | None
) -> Any:
    """The contract call landing ``payloads`` of ``node`` (``signed``: relayed)."""
    abi = [p.as_abi() for p in payloads]
    if signed is None:
        return fns.commit(abi[0]) if len(abi) == 1 else fns.commitMany(abi)
    nonce, signatures = signed
    if len(abi) == 1:
        return fns.commitBySig(node, abi[0], nonce, signatures[0])
    return fns.commitManyBySig(node, abi, nonce, signatures[: len(abi)])


def per_round(receipt: SubmitReceipt, payloads: Sequence[CommitmentPayload]) -> list[SubmitReceipt]:
    """One receipt per commitment of a batch: the transaction's, with that round's claims and
    the transaction's gas shared evenly."""
    share = receipt.gas_used // len(payloads)
    return [
        replace(
            receipt,
            gas_used=share,
            claimed=tuple(
                c
                for c, r in zip(receipt.claimed, receipt.claim_rounds, strict=True)
                if r == p.round
            ),
            claim_rounds=(),
        )
        for p in payloads
    ]
