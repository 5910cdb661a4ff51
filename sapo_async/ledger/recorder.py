"""The recorder actor: moves each round's commitment from the journal onto the ledger.

Owns delivery: :meth:`Recorder.record` journals a :class:`RoundCommitment` durably and returns
without waiting for the chain; one sender task lands pending entries in round order with
retries and jittered exponential backoff (:class:`sapo_async.backoff.Backoff`), and resumes
whatever a previous process left pending. It sends up to ``limits.LEDGER_BATCH_DEPTH`` of
them (and ``limits.LEDGER_BATCH_MAX_USAGE`` usage entries) as one transaction
(:meth:`Ledger.submit_many`: one atomic ``commitMany``, so a slow chain lands a backlog in one
block and no round of it can land while an earlier one is refused). It does not know how
rounds are made or how the chain is reached.

Exactly-once: rounds strictly increase per node on chain, so a resend of a round that
already landed (say the process died after sending, before journaling the receipt) reverts.
The sender therefore reads the chain first (unless it has just landed what it sent last
itself, in this process, with no failure since) and after any revert: a stored commitment
equal to the journaled one means "already landed" and is marked so, never re-sent; a
different one is a conflict; none while a later round is stored means the round was
superseded and can never land. Those last two are marked failed and logged, and the sender
moves on. Nothing else fails a round but a rule the chain names: a revert without a reason
(the state moved between the simulation and the block) is sent again until it lands, and a
round refused as not increasing while no later round is on chain is its own earlier
transaction still waiting in the mempool, awaited. Sending stops at the first round refused:
the rounds before it land as one batch, none after it is sent, so none can supersede it. A
batch mined and reverted (no reason: no verdict on any one round) is followed by its first
round sent alone, so a round that keeps reverting cannot hold the rest back unseen: alone, it
is the one judged.

No waiting on other nodes: the contract credits a producer only for a round that producer
committed, and producers land their rounds on their own schedule. A usage entry whose
producer round is not on chain yet does not hold the commitment back: the contract keeps it
as a claim of this node's round, and the commitment lands at once. Once nothing of this node
is pending (or claims have waited ``settle_defer_s``), the sender settles its open claims
whose producer round is on chain by now
(:class:`~sapo_async.ledger.settlement.ClaimSettler`: one read per producer,
``settleCredits`` in batches), each exactly once (the chain refuses a settled claim as
``SapoLedgerNothingToSettle``, and it is marked settled). A claim whose producer round has
not come after ``limits.LEDGER_CLAIM_LAPSE_S`` is no longer polled
(``credit_claim_lapsed``); it stays on chain, and anyone may still settle it. A producer
being slow never costs it credit. The one usage ever dropped from a journaled commitment is
usage its producer's *own* commitment on chain refuses (that round shared nothing, or fewer
rollouts than this node used: a publish the server acked while the producer saw it fail):
the round then lands without it (``credit_refused_by_producer_round``) instead of failing.

Life cycle (:class:`~sapo_async.actors.Actor`): created -> starting -> running -> draining
-> stopped (or failed, surfacing as ActorFailed). Drain gives the sender up to
``drain_timeout_s`` to land what is pending; what is left stays journaled for the next
start. Asking a stopped recorder for work raises ActorStopped.

Journal writes go through :meth:`Journal.write`, so an fsync never stalls the event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from eth_account.signers.local import LocalAccount

from sapo_async import limits
from sapo_async.actors import Actor, ActorState
from sapo_async.backoff import Backoff
from sapo_async.errors import (
    ActorStopped,
    CommitmentRejected,
    JournalError,
    LedgerError,
    RejectedInput,
)
from sapo_async.ledger.base import Ledger
from sapo_async.ledger.journal import ClaimState, EntryState, Journal, JournalEntry
from sapo_async.ledger.settlement import ClaimSettler
from sapo_async.ledger.types import OnChainCommitment, RoundCommitment, SubmitReceipt
from sapo_async.logs import get_logger
from sapo_async.pulse import Pulse

__all__ = ["Recorder", "RecorderStats"]

_REFUSED_CREDIT = ("SapoLedgerProducerRoundNotCommitted", "SapoLedgerCreditExceedsShared")
"""Reverts that name a usage entry whose producer round is on chain and shared less."""


@dataclass(frozen=True, slots=True)
class RecorderStats:
    """A snapshot of a recorder (see :meth:`Recorder.statistics`).

    Attributes:
        pending / landed / failed: journal entries of this node per state.
        send_failures: failed sends (chain unreachable or retryable revert) this session.
        last_error: the latest send failure, if any.
        claims_open / claims_settled: usage entries of landed rounds whose credit is still
            a claim on chain / has been credited (with the commitment or settled later).
    """

    state: ActorState
    pending: int
    landed: int
    failed: int
    send_failures: int
    last_error: str | None
    claims_open: int = 0
    claims_settled: int = 0


class Recorder(Actor):
    """Journals and lands one node's round commitments.

    Args:
        ledger: where commitments go.
        journal: where they are written first (may be shared by several recorders).
        account: the node's key: its address is the node, it signs relayed commitments (or
            sends them itself when the ledger has no relayer).
        metadata: registration metadata (for example the model id), used once if the node
            is not yet registered.
        retry_base_s: first backoff of a failed send.
        retry_max_s: longest backoff between failed sends.
        drain_timeout_s: how long closing waits for pending entries to land.
        settle_defer_s: longest open credit claims wait for this node's pending
            commitments before a settle pass runs between two batches.
    """

    def __init__(
        self,
        ledger: Ledger,
        journal: Journal,
        account: LocalAccount,
        *,
        metadata: str = "",
        retry_base_s: float = limits.LEDGER_RETRY_BASE_S,
        retry_max_s: float = limits.LEDGER_RETRY_MAX_S,
        drain_timeout_s: float = limits.ACTOR_DRAIN_TIMEOUT_S,
        settle_defer_s: float = limits.LEDGER_SETTLE_MAX_DEFER_S,
    ) -> None:
        super().__init__("recorder", drain_timeout=drain_timeout_s)
        self._ledger = ledger
        self._journal = journal
        self._account = account
        self._metadata = metadata
        self._retry_max_s = retry_max_s
        self._backoff = Backoff(retry_base_s, retry_max_s, jitter=limits.RETRY_JITTER)
        # A latch, not a pulse: a wake given while the sender is busy must still hold when
        # it next idles, so only the sender replaces it, once it saw it set.
        self._wake = anyio.Event()
        self._progress = Pulse()
        self._registered = False
        self._chain_known = False  # True right after this recorder landed an entry itself
        self._solo = False  # True after a batch reverted when mined: send one round next
        self._send_failures = 0
        self._last_error: str | None = None
        self._log = get_logger("recorder", node=account.address)
        self._settler = ClaimSettler(ledger, journal, account, self._log)
        self._settle_defer_s = settle_defer_s

    @property
    def node(self) -> str:
        """The node whose commitments this recorder lands."""
        return str(self._account.address)

    async def aclose(self) -> None:
        """Drain (land what is pending, within the drain timeout), then stop. Idempotent."""
        await self.stop()

    # ------------------------------------------------------------------ actor hooks

    async def _setup(self) -> None:
        self._log.info("recorder_started", pending=len(self._journal.pending(self.node)))

    async def _serve(self) -> None:
        await self._send_loop()

    async def _drain(self) -> None:
        # The sender keeps running while the actor drains; wait for it to empty the queue.
        await self._wait_until(lambda: not self._journal.pending(self.node))

    async def _teardown(self) -> None:
        s = self.statistics()
        if s.pending:
            self._log.warning("recorder_drain_incomplete", pending=s.pending)
        self._log.info("recorder_stopped", pending=s.pending, landed=s.landed, failed=s.failed)

    # ------------------------------------------------------------------ intake

    async def record(self, commitment: RoundCommitment) -> bool:
        """Journal ``commitment`` durably, off the event loop, and schedule it for the chain.

        Returns once the entry is on disk (never waits for the chain).

        Returns:
            True if newly journaled, False if this exact commitment already was.

        Raises:
            ActorStopped: the recorder is not running.
            RejectedInput: the commitment is for another node (``wrong_node``), conflicts
                with a journaled one, or its round does not increase.
        """
        self._check_intake(commitment)
        fresh = await self._journal.write(self._journal.append, commitment)
        self._journaled(commitment, fresh)
        return fresh

    def _check_intake(self, commitment: RoundCommitment) -> None:
        if self.state is not ActorState.RUNNING:
            raise ActorStopped(self.name, self.state.value)
        if commitment.node != self.node:
            raise RejectedInput(
                "wrong_node", f"recorder of {self.node} got a commitment of {commitment.node}"
            )

    def _journaled(self, commitment: RoundCommitment, fresh: bool) -> None:
        if fresh:
            self._log.info(
                "commitment_journaled",
                round=commitment.round,
                policy_version=commitment.policy_version,
                rollouts=len(commitment.rollout_hashes),
                external=commitment.external_count,
            )
        self._wake.set()

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until nothing of this node is pending.

        Raises:
            TimeoutError: entries are still pending after ``timeout_s``.
            ActorStopped: the recorder stopped while entries were pending.
        """
        with anyio.fail_after(timeout_s):
            await self._wait_until(lambda: not self._journal.pending(self.node))

    async def wait_settled(self, round_: int, timeout_s: float) -> JournalEntry:
        """Wait until this node's ``round_`` has landed or failed; return its entry.

        Raises:
            RejectedInput: the round was never journaled (``unknown_round``).
            TimeoutError: still pending after ``timeout_s``.
            ActorStopped: the recorder stopped first.
        """

        def settled() -> bool:
            entry = self._journal.entry(self.node, round_)
            if entry is None:
                raise RejectedInput("unknown_round", f"round {round_} of {self.node}")
            return entry.state is not EntryState.PENDING

        with anyio.fail_after(timeout_s):
            await self._wait_until(settled)
        entry = self._journal.entry(self.node, round_)
        if entry is None:  # journals only grow; kept for the type checker
            raise RejectedInput("unknown_round", f"round {round_} of {self.node}")
        return entry

    def statistics(self) -> RecorderStats:  # type: ignore[override] # journal counts
        """Counts of this node's journal entries and this session's send failures."""
        counts = self._journal.counts(self.node)
        claims = self._journal.claim_counts(self.node)
        return RecorderStats(
            state=self.state,
            pending=counts[EntryState.PENDING],
            landed=counts[EntryState.LANDED],
            failed=counts[EntryState.FAILED],
            send_failures=self._send_failures,
            last_error=self._last_error,
            claims_open=claims[ClaimState.OPEN],
            claims_settled=claims[ClaimState.SETTLED],
        )

    def landing_delays(self) -> dict[int, float]:
        """Seconds from journaling to landing of each landed round of this node (the
        journal's clock, so rounds landed by an earlier process count too)."""
        return {
            e.round: e.settled_at - e.created_at
            for e in self._journal.entries(self.node)
            if e.state is EntryState.LANDED and e.settled_at is not None
        }

    async def wait_backlog(self, most: int, timeout_s: float) -> None:
        """Wait until at most ``most`` of this node's commitments are pending.

        Raises:
            TimeoutError: more are still pending after ``timeout_s``.
            ActorStopped: the recorder stopped first.
        """
        with anyio.fail_after(timeout_s):
            await self._wait_until(
                lambda: self._journal.counts(self.node)[EntryState.PENDING] <= most
            )

    async def wait_credit_settled(self, timeout_s: float) -> None:
        """Wait until nothing is pending and a whole pass over the open claims, begun after
        this call, settled every claim whose producer round was on chain.

        Claims on producer rounds still missing stay open; this does not wait for them.

        Raises:
            TimeoutError: not in time (the chain is unreachable, or busy).
            ActorStopped: the recorder stopped first.
        """
        target = self._settler.passes + 2  # the pass under way may have begun before this call
        with anyio.fail_after(timeout_s):
            while self._settler.passes < target:
                # Wake the sender for each pass: an idle sender waits for a wake (or its
                # idle interval, up to retry_max_s) between passes.
                seen = self._settler.passes
                self._wake.set()
                await self._wait_until(lambda: self._settler.passes > seen)  # noqa: B023

    async def _wait_until(self, done: Callable[[], bool]) -> None:
        while not done():
            if self.state in (ActorState.STOPPED, ActorState.FAILED):
                raise ActorStopped(self.name, self.state.value)
            # The sender fires `_progress` after every settled entry; the short bound also
            # covers entries settled by another recorder sharing the journal.
            with anyio.move_on_after(0.5):
                await self._progress.wait()

    # ------------------------------------------------------------------ sender

    async def _send_loop(self) -> None:
        attempt = 0
        while True:
            pending = self._journal.pending(self.node)
            try:
                if pending:
                    if self._settler.deferred_s() >= self._settle_defer_s:
                        await self._settler.settle_pass(yield_to_commitments=False)
                    await self._land(self._batch(pending))
                elif not await self._settler.settle_pass():
                    continue  # a commitment was journaled meanwhile: it goes first
            except LedgerError as exc:
                round_ = pending[0].round if pending else None
                await self._failed(exc, round_, attempt)
                attempt += 1
                continue
            attempt = 0
            self._progress.fire()
            if not pending:
                wake = self._wake
                idle_s = (
                    limits.LEDGER_SETTLE_INTERVAL_S
                    if self._journal.open_claims(self.node)
                    else self._retry_max_s
                )
                with anyio.move_on_after(idle_s):
                    await wake.wait()
                if wake.is_set():
                    self._wake = anyio.Event()

    async def _failed(self, exc: LedgerError, round_: int | None, attempt: int) -> None:
        """Count a failed send (of the pending ``round_``, or of a settlement) and back off;
        a journal that cannot be written (locked, full, read-only) is one too: what was sent
        stays pending, and the next pass reads the chain first. A damaged one is raised."""
        if isinstance(exc, JournalError) and exc.cause == "damaged":
            raise exc
        self._send_failures += 1
        self._last_error = f"{type(exc).__name__}: {exc}"
        if round_ is not None and not isinstance(exc, JournalError):
            with contextlib.suppress(JournalError):  # a count only; the next write tells
                await self._journal.write(
                    self._journal.record_attempt, self.node, round_, self._last_error
                )
        delay = self._backoff.delay(attempt)
        log = self._log.warning if attempt < limits.LEDGER_MAX_ATTEMPTS_LOGGED else self._log.debug
        event = "commitment_send_failed" if round_ is not None else "credit_settle_failed"
        log(event, round=round_, error=self._last_error, retry_in_s=delay)
        await anyio.sleep(delay)  # backoff, not a condition wait: nothing to wait on

    def _batch(self, pending: list[JournalEntry]) -> list[JournalEntry]:
        """The oldest pending entries one transaction carries: at least one, at most
        ``LEDGER_BATCH_DEPTH`` and ``LEDGER_BATCH_MAX_USAGE`` usage entries (its gas)."""
        if self._solo:
            return pending[:1]
        batch, usage = pending[:1], len(pending[0].commitment.usage())
        for entry in pending[1 : limits.LEDGER_BATCH_DEPTH]:
            usage += len(entry.commitment.usage())
            if usage > limits.LEDGER_BATCH_MAX_USAGE:
                break
            batch.append(entry)
        return batch

    async def _land(self, entries: list[JournalEntry]) -> None:
        """Land ``entries``, this node's oldest pending ones in ascending rounds, as one
        transaction (or the rounds before the first refused one)."""
        first = entries[0]
        # The pre-read is skipped only right after this recorder landed every entry it sent
        # last: nothing else sends for this node, so the next round cannot be on chain yet
        # (and if it were, the resend would be refused and the read after it finds it).
        known, self._chain_known = self._chain_known, False
        stored = None if known else await self._ledger.commitment_of(self.node, first.round)
        if stored is not None:
            await self._found(first, stored)
            return
        if not self._registered:
            await self._ledger.register(self._account, self._metadata)
            self._registered = True
        payloads = [e.commitment.payload() for e in entries]
        outcomes = await self._ledger.submit_many(self._account, payloads)
        failed: tuple[JournalEntry, LedgerError] | None = None
        for entry, outcome in zip(entries, outcomes, strict=False):
            if isinstance(outcome, LedgerError):
                failed = failed or (entry, outcome)
            else:  # receipts only come before the first error (the rounds before it)
                await self._landed(entry, outcome)
        if failed is None:
            self._chain_known = True  # the next pending round was sent by no one yet
            self._solo = False
            return
        entry, exc = failed
        if not isinstance(exc, CommitmentRejected):
            raise exc  # the receipt was not seen: the next pass reads the chain first
        # Mined and reverted as a whole: which round failed is unknown, so the first goes
        # alone until one lands.
        self._solo = exc.tx_hash is not None and exc.reason is None
        stored = await self._ledger.commitment_of(self.node, entry.round)
        if stored is None:
            await self._reject(entry, exc)
        else:
            await self._found(entry, stored)

    async def _landed(self, entry: JournalEntry, receipt: SubmitReceipt) -> None:
        await self._journal.write(
            self._journal.mark_landed,
            self.node,
            entry.round,
            tx_hash=receipt.tx_hash,
            block_number=receipt.block_number,
            claimed=receipt.claimed,
        )
        self._log.info(
            "commitment_confirmed",
            round=entry.round,
            tx_hash=receipt.tx_hash,
            block=receipt.block_number,
            gas=receipt.gas_used,
            claims=len(receipt.claimed),
        )

    async def _found(self, entry: JournalEntry, stored: OnChainCommitment) -> None:
        """``entry``'s round is on chain already (sent before, by this or an earlier process)."""
        if stored.matches(entry.commitment.payload()):
            await self._journal.write(
                self._journal.mark_landed,
                self.node,
                entry.round,
                tx_hash=None,
                block_number=stored.block_number,
            )
            self._log.info(
                "commitment_already_landed", round=entry.round, block=stored.block_number
            )
        else:
            reason = "conflict: the chain holds a different commitment for this round"
            await self._journal.write(self._journal.mark_failed, self.node, entry.round, reason)
            self._log.error("commitment_conflicted", round=entry.round)

    async def _withdraw_refused_credit(self, entry: JournalEntry) -> bool:
        """Drop the usage of producer rounds whose own commitment refuses it (it shared
        nothing, or fewer rollouts than this node used: a publish the server acked while its
        producer saw it fail). Returns whether any was dropped."""
        refused = set()
        for producer, r, hashes in entry.commitment.usage():
            shared = await self._ledger.commitment_of(producer, r)
            if shared is None:
                continue  # not on chain yet: the chain keeps it as a claim
            credited = await self._ledger.credited_by(self.node, producer, r)
            if credited + len(hashes) > shared.rollout_count:
                refused.add((producer, r))
        if refused:
            await self._journal.write(self._journal.withdraw_usage, self.node, entry.round, refused)
            self._log.warning(
                "credit_refused_by_producer_round",
                round=entry.round,
                producer_rounds=sorted(f"{p}:{r}" for p, r in refused),
            )
        return bool(refused)

    async def _reject(self, entry: JournalEntry, exc: CommitmentRejected) -> None:
        if exc.reason == "InvalidAccountNonce":
            raise exc  # another relay used the node's nonce first: retry with a fresh one
        # A revert mined without a reason is no verdict: the state moved between the
        # simulation and the block (say a producer round it credits landed first in the same
        # block: the credit costs more gas than the claim it was simulated as). Find refused
        # usage from the chain itself, and send again, however many times: the next
        # simulation names any rule that really refuses the round.
        unknown = exc.reason is None
        refusable = exc.reason in _REFUSED_CREDIT or unknown
        if refusable and (await self._withdraw_refused_credit(entry) or unknown):
            raise exc  # send the (reduced) commitment on the next pass
        if exc.reason == "SapoLedgerRoundNotIncreasing":
            last = (await self._ledger.node_stats(self.node)).last_round
            if last is None or last < entry.round:
                # Refused against the pending block, which holds this round's own earlier
                # send (a receipt wait cut short, or a previous process): not superseded.
                raise exc
            reason = "superseded: a later round of this node is already on chain"
        else:
            reason = f"rejected: {exc}"
        await self._journal.write(self._journal.mark_failed, self.node, entry.round, reason)
        self._log.error("commitment_rejected", round=entry.round, reason=reason)
