"""Settling one node's credit claims: usage its landed rounds named before the producer round
was on chain, credited later with ``settleCredit`` (moved out of :mod:`.recorder`, whose
sender calls one pass at a time when nothing of its node is pending).

Owns the pass over the journal's open claims and each claim's outcome: ``settled`` (credited
with the commitment, by this pass or by anyone), ``lapsed`` (its producer round has not come
within ``limits.LEDGER_CLAIM_LAPSE_S``; still on chain for anyone to settle) or ``refused``
(the chain names a rule against it). Each claim is settled at most once: ``claimOf`` is read
first, and 0 means nothing is left to settle. Does not retry or back off (the sender does),
and knows nothing of commitments still pending.
"""

from __future__ import annotations

import time
from typing import Any

from eth_account.signers.local import LocalAccount

from sapo_async import limits
from sapo_async.errors import CommitmentRejected, LedgerError
from sapo_async.ledger.base import Ledger
from sapo_async.ledger.journal import ClaimState, CreditClaim, Journal

__all__ = ["ClaimSettler"]


class ClaimSettler:
    """Settles ``account``'s open claims on ``ledger``, journaling each outcome.

    Args:
        ledger: where claims are read and settled.
        journal: where the claims are kept.
        account: the consumer node (it sends ``settleCredit`` when the ledger has no relayer).
        log: the recorder's bound logger.
    """

    def __init__(self, ledger: Ledger, journal: Journal, account: LocalAccount, log: Any) -> None:
        self._ledger = ledger
        self._journal = journal
        self._account = account
        self._node = str(account.address)
        self._log = log
        self.passes = 0
        """Complete, error-free passes over the open claims."""

    async def settle_pass(self) -> bool:
        """One pass over the open claims; False if it stopped early for a new commitment.

        Claims whose producer round is on chain are sent together, up to
        ``limits.LEDGER_PIPELINE_DEPTH`` at a time (:meth:`Ledger.settle_credit_many`);
        the rest are read and left open (or lapsed).

        Raises:
            LedgerError: the chain could not be reached (the pass is retried whole).
        """
        ready: list[CreditClaim] = []
        for claim in self._journal.open_claims(self._node):
            if self._journal.pending(self._node):
                return False
            if await self._ready(claim):
                ready.append(claim)
            if len(ready) == limits.LEDGER_PIPELINE_DEPTH:
                await self._settle(ready)
                ready = []
        if ready and not self._journal.pending(self._node):
            await self._settle(ready)
        elif ready:
            return False
        self.passes += 1
        return True

    async def _ready(self, claim: CreditClaim) -> bool:
        """True when ``claim`` can be sent now; journals the claims that need no sending."""
        key = _key(claim)
        if await self._ledger.claim_of(*key) == 0:
            # Credited with the commitment (its producer round was on chain), or settled since.
            await self._journal.write(self._journal.settle_claim, *key, state=ClaimState.SETTLED)
            return False
        if await self._ledger.commitment_of(claim.producer, claim.producer_round) is not None:
            return True
        if time.time() - claim.created_at > limits.LEDGER_CLAIM_LAPSE_S:
            await self._journal.write(self._journal.settle_claim, *key, state=ClaimState.LAPSED)
            self._claim_log(claim).info("credit_claim_lapsed")
        return False

    async def _settle(self, claims: list[CreditClaim]) -> None:
        outcomes = await self._ledger.settle_credit_many(self._account, [_key(c) for c in claims])
        for claim, outcome in zip(claims, outcomes, strict=False):
            key, log = _key(claim), self._claim_log(claim)
            if not isinstance(outcome, LedgerError):
                await self._journal.write(
                    self._journal.settle_claim, *key, state=ClaimState.SETTLED
                )
                log.info("credit_settled", count=claim.count, tx_hash=outcome.tx_hash)
                continue
            if (
                not isinstance(outcome, CommitmentRejected)
                or outcome.reason == "InvalidAccountNonce"
            ):
                raise outcome
            if outcome.reason is None or outcome.reason == "SapoLedgerNothingToSettle":
                # Settled by someone meanwhile, or reverted on chain with no reason: the
                # claim's own slot says which (still open: the next pass sends it again).
                if await self._ledger.claim_of(*key) == 0:
                    await self._journal.write(
                        self._journal.settle_claim, *key, state=ClaimState.SETTLED
                    )
                continue
            await self._journal.write(
                self._journal.settle_claim,
                *key,
                state=ClaimState.REFUSED,
                reason=str(outcome)[:500],
            )
            log.error("credit_settle_refused", reason=outcome.reason)

    def _claim_log(self, claim: CreditClaim) -> Any:
        return self._log.bind(
            round=claim.round, producer=claim.producer, producer_round=claim.producer_round
        )


def _key(claim: CreditClaim) -> tuple[str, int, str, int]:
    return (claim.node, claim.round, claim.producer, claim.producer_round)
