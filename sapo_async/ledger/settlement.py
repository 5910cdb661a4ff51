"""Settling one node's credit claims: usage its landed rounds named before the producer round
was on chain, credited later with ``settleCredit`` (moved out of :mod:`.recorder`, whose
sender calls one pass at a time when nothing of its node is pending).

Owns the pass over the journal's open claims and each claim's outcome: ``settled`` (credited
with the commitment, by this pass or by anyone), ``lapsed`` (its producer round has not come
within ``limits.LEDGER_CLAIM_LAPSE_S``; still on chain for anyone to settle) or ``refused``
(the chain names a rule against it). Each claim is settled at most once: ``claimOf`` is read
first, and 0 means nothing is left to settle. The claims ready in a pass go out together
(``settleCredits``, atomic): at 12 s blocks one transaction per claim, each awaited, took
minutes per node for a backlog of batched rounds. Does not retry or back off (the sender does),
and knows nothing of commitments still pending.

A pass reads the chain once per *producer* (its last committed round), not per claim: rounds
strictly increase, so a claim is ready exactly when its producer's last round reached the
claimed one (the round is on chain, or was skipped and can never come: then the chain refuses
the settlement by name and the claim is marked refused). Reading two views per open claim
made a pass over a busy node's hundreds of claims hold the embedded chain's one lock for tens
of seconds, and stalled every node's commitments behind it (the README's swarm, 2026-12-02:
backlogs of 30 rounds, a round 116 s from journal to chain). A claim settled by someone else
meanwhile is refused as ``SapoLedgerNothingToSettle`` and marked settled.
"""

from __future__ import annotations

import time
from typing import Any

from eth_account.signers.local import LocalAccount

from sapo_async import limits
from sapo_async.errors import CommitmentRejected
from sapo_async.ledger.base import Ledger
from sapo_async.ledger.journal import ClaimState, CreditClaim, Journal
from sapo_async.ledger.types import MAX_BATCH

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
        self._last_pass = time.monotonic()

    def deferred_s(self) -> float:
        """Seconds since the last complete pass, while claims are open (0 with none)."""
        if not self._journal.open_claims(self._node):
            return 0.0
        return time.monotonic() - self._last_pass

    async def settle_pass(self, *, yield_to_commitments: bool = True) -> bool:
        """One pass over the open claims; False if it stopped early for a new commitment
        (never, with ``yield_to_commitments`` False: the recorder's bound on deferral).
        The claims ready to settle (producer round on chain, not credited yet) go in
        ``settleCredits`` batches of up to ``MAX_BATCH``; a batch refused as a whole goes
        again without the claims the chain no longer holds, and one claim at a time only
        when every claim of it still stands, so one refused claim holds back no other.

        Raises:
            LedgerError: the chain could not be reached (the pass is retried whole).
        """

        def yielding() -> bool:
            return yield_to_commitments and bool(self._journal.pending(self._node))

        ready: list[CreditClaim] = []
        last_rounds: dict[str, int | None] = {}
        for claim in self._journal.open_claims(self._node):
            if yielding():
                return False
            if claim.producer not in last_rounds:
                stats = await self._ledger.node_stats(claim.producer)
                last_rounds[claim.producer] = stats.last_round
            if await self._ready(claim, last_rounds[claim.producer]):
                ready.append(claim)
            if len(ready) == MAX_BATCH:
                await self._settle_batch(ready)
                ready = []
        if ready and yielding():
            return False
        if ready:
            await self._settle_batch(ready)
        self.passes += 1
        self._last_pass = time.monotonic()
        return True

    async def _ready(self, claim: CreditClaim, last_round: int | None) -> bool:
        """Whether ``claim`` can be settled now, its producer's last round on chain being
        ``last_round``; journals it lapsed if its producer round is overdue."""
        key = (claim.node, claim.round, claim.producer, claim.producer_round)
        if last_round is None or last_round < claim.producer_round:
            if time.time() - claim.created_at > limits.LEDGER_CLAIM_LAPSE_S:
                await self._journal.write(self._journal.settle_claim, *key, state=ClaimState.LAPSED)
                self._claim_log(claim).info("credit_claim_lapsed")
            return False
        return True

    async def _settle_batch(self, claims: list[CreditClaim]) -> None:
        if len(claims) == 1:
            await self._settle(claims[0])
            return
        keys = [(c.node, c.round, c.producer, c.producer_round) for c in claims]
        try:
            receipts = await self._ledger.settle_credits(self._account, keys)
        except CommitmentRejected as exc:
            if exc.reason == "InvalidAccountNonce":
                raise
            # Usually a claim settled meanwhile (or credited with its commitment, when a
            # restart found the round on chain without its receipt): read those claims and
            # send the rest as one batch again, not one transaction per claim (a block each).
            rest = [c for c in claims if await self._still_open(c)]
            if len(rest) < len(claims):
                if rest:
                    await self._settle_batch(rest)
                return
            for claim in claims:  # which one was refused is the chain's to say, one by one
                await self._settle(claim)
            return
        for claim, receipt in zip(claims, receipts, strict=True):
            await self._settled(claim, receipt.tx_hash)

    async def _still_open(self, claim: CreditClaim) -> bool:
        """Whether ``claim`` (ready: its producer's last round reached it) can still be
        settled; journals it settled if the chain has nothing left of it, and lapsed if its
        producer round was skipped (a later round of the producer is on chain, so it can
        never come: polled on, it would be refused with every batch, forever)."""
        key = (claim.node, claim.round, claim.producer, claim.producer_round)
        if await self._ledger.claim_of(*key) == 0:
            await self._journal.write(self._journal.settle_claim, *key, state=ClaimState.SETTLED)
            return False
        if await self._ledger.commitment_of(claim.producer, claim.producer_round) is None:
            await self._journal.write(self._journal.settle_claim, *key, state=ClaimState.LAPSED)
            self._claim_log(claim).info("credit_claim_lapsed", reason="producer_round_skipped")
            return False
        return True

    async def _settle(self, claim: CreditClaim) -> None:
        key = (claim.node, claim.round, claim.producer, claim.producer_round)
        try:
            receipt = await self._ledger.settle_credit(self._account, *key)
        except CommitmentRejected as exc:
            if exc.reason in ("SapoLedgerNothingToSettle", None):
                # Settled by someone meanwhile, or reverted when mined with no reason (out of
                # gas, say): the claim's own slot says which; still open, the next pass
                # sends it again.
                if exc.reason is not None or await self._ledger.claim_of(*key) == 0:
                    await self._journal.write(
                        self._journal.settle_claim, *key, state=ClaimState.SETTLED
                    )
                return
            if exc.reason == "InvalidAccountNonce":
                raise
            await self._journal.write(
                self._journal.settle_claim, *key, state=ClaimState.REFUSED, reason=str(exc)[:500]
            )
            self._claim_log(claim).error("credit_settle_refused", reason=exc.reason)
            return
        await self._settled(claim, receipt.tx_hash)

    async def _settled(self, claim: CreditClaim, tx_hash: str) -> None:
        key = (claim.node, claim.round, claim.producer, claim.producer_round)
        await self._journal.write(self._journal.settle_claim, *key, state=ClaimState.SETTLED)
        self._claim_log(claim).info("credit_settled", count=claim.count, tx_hash=tx_hash)

    def _claim_log(self, claim: CreditClaim) -> Any:
        return self._log.bind(
            round=claim.round, producer=claim.producer, producer_round=claim.producer_round
        )
