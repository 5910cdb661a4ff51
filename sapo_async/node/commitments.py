"""A round's commitment, and the commitments a node holds until the journal has them.

A commitment names the round and the policy version just trained. Journaled (and so sent)
before a checkpoint holds that state, a node killed then would resume from an older
checkpoint and redo rounds and policy versions the chain already names. So the round loop
holds each commitment here until the next checkpoint is on disk (every round for the tiny
model, every ``checkpoint.every`` rounds at real size: docs/learning.md), then releases them
to the recorder in round order; a node that keeps no checkpoints releases at once.

Exactly once, through any failure of the node's own storage: the checkpoint that covers a
held commitment's round also carries the commitment (:meth:`HeldCommitments.carried`, in
the checkpoint's ``extra``), and a commitment leaves the hold only once the journal has it.
So between the checkpoint and the journal write it is always somewhere durable: a node
stopped, killed or failed there journals it from the checkpoint when it resumes
(:func:`journal_carried`), and the journal's own rule (one commitment per node and round)
makes a second write of it a no-op. A journal locked by another process is waited out
(new rounds wait with it; a one-line status says which file); a full, read-only or damaged
journal stops the node with the journal's message, the held commitments still in the
checkpoint.

Deliberately does not know when checkpoints are written (the round loop's business).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from sapo_async import limits
from sapo_async.backoff import Backoff
from sapo_async.errors import ActorStopped, JournalError, RejectedInput
from sapo_async.ledger.types import RoundCommitment

if TYPE_CHECKING:
    from sapo_async.ledger.journal import Journal
    from sapo_async.ledger.recorder import Recorder
    from sapo_async.node.groups import SharedRound
    from sapo_async.node.selection import Candidate

__all__ = ["CARRIED", "HeldCommitments", "journal_carried", "round_commitment", "wait_out_lock"]

_T = TypeVar("_T")

CARRIED = "commitments"
"""The key, in a checkpoint's ``extra``, of the commitments it carries (JSON bodies)."""

JOURNAL_LOCK_BACKOFF = Backoff(
    limits.JOURNAL_LOCK_RETRY_BASE_S, limits.JOURNAL_LOCK_RETRY_MAX_S, jitter=limits.RETRY_JITTER
)
"""How a node retries a journal another process holds locked."""


async def wait_out_lock(
    write: Callable[[], Awaitable[_T]], *, stopping: Callable[[], bool], log: Any
) -> tuple[_T] | None:
    """Call ``write()`` until the journal it writes is not locked by another process.

    Logs ``journal_locked`` (the file, the wait so far, the next try) while it waits, and
    ``journal_unlocked`` once a write went through after a wait.

    Returns:
        ``(result,)``, or None when ``stopping()`` turned true while the journal was locked.

    Raises:
        JournalError: any other failure of the journal (full, read-only, damaged).
        Exception: whatever else ``write`` raises.
    """
    attempt = 0
    started = anyio.current_time()
    while True:
        try:
            result = await write()
        except JournalError as exc:
            if not exc.locked:
                raise
            if stopping():
                return None
            delay = JOURNAL_LOCK_BACKOFF.delay(attempt)
            waited = round(anyio.current_time() - started, 1)
            log.warning("journal_locked", path=exc.path, waited_s=waited, retry_in_s=delay)
            attempt += 1
            await anyio.sleep(delay)  # a backoff: the other process gives no signal
            continue
        if attempt:
            log.info("journal_unlocked", waited_s=round(anyio.current_time() - started, 1))
        return (result,)


async def journal_carried(
    journal: Journal, node: str, bodies: Sequence[str], log: Any
) -> list[int]:
    """Journal the commitments a resumed checkpoint carried that the journal lacks.

    A round the journal already names (this commitment, or the one it became once a
    refused credit was withdrawn) is left as it is; so is one at or below the node's
    highest journaled round (the journal took a later one: nothing to add).

    Returns:
        the rounds journaled now.

    Raises:
        JournalError: the journal cannot be written (full, read-only, damaged; a lock is
            waited out), or a carried body that does not parse.
    """
    highest = max((e.round for e in journal.entries(node)), default=-1)
    added: list[int] = []
    for body in bodies:
        try:
            commitment = RoundCommitment.from_json(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalError(
                f"a checkpoint carried a commitment that does not parse ({exc}); the "
                "journal was left as it is",
                path=str(journal.path),
            ) from exc
        if commitment.node != node or commitment.round <= highest:
            continue
        append = functools.partial(journal.write, journal.append, commitment)
        await wait_out_lock(append, stopping=lambda: False, log=log)  # before any round
        highest = commitment.round
        added.append(commitment.round)
    if added:
        log.info("commitments_journaled_from_checkpoint", rounds=added)
    return added


def round_commitment(node: str, shared: SharedRound, chosen: list[Candidate]) -> RoundCommitment:
    """The commitment of ``shared``'s round: what it shared, and what it used by producer.

    Usage is keyed by the producer's own round: the ledger credits a producer only for a
    round it committed, and never for more rollouts than it committed in that round.
    """
    by_producer: dict[str, dict[int, list[bytes]]] = {}
    for c in chosen:
        by_round = by_producer.setdefault(c.producer, {})
        by_round.setdefault(c.buffered.group.producer_round, []).append(c.buffered.rollout_hash)
    return RoundCommitment(
        node=node,
        round=shared.round,
        policy_version=shared.policy_version,
        rollout_hashes=shared.hashes,
        external_hashes=by_producer,
    )


class HeldCommitments:
    """Commitments waiting for a checkpoint, then for the journal, in round order.

    Args:
        recorder: journals them (None: a node without a ledger holds nothing).
        log: the node's logger.
        stopping: true once the node is stopping (a locked journal is not waited out then).
    """

    def __init__(
        self, recorder: Recorder | None, log: Any, *, stopping: Callable[[], bool]
    ) -> None:
        self._recorder = recorder
        self._log = log
        self._stopping = stopping
        self._held: list[RoundCommitment] = []

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, commitment: RoundCommitment) -> None:
        """Keep ``commitment`` until :meth:`release` journals it."""
        self._held.append(commitment)

    def carried(self) -> dict[str, list[str]]:
        """What a checkpoint written now carries: the held commitments (its ``extra``)."""
        return {CARRIED: [c.to_json() for c in self._held]}

    async def release(self) -> None:
        """Journal every held commitment, in round order (a checkpoint now covers them).

        Each leaves the hold once the journal has it, never before. A journal locked by
        another process is waited out (see :func:`wait_out_lock`); while the node stops, or
        once the recorder stopped, the rest stay held (and carried by the checkpoint). One
        the journal refuses is logged and dropped (it would be refused again).

        Raises:
            JournalError: the journal is full, read-only or damaged (the held stay held).
        """
        recorder = self._recorder
        while self._held and recorder is not None:
            commitment = self._held[0]

            # Not shielded: a write that started always finishes (Journal.write), and one
            # cancelled after it leaves the commitment held, so it is written again, a no-op.
            try:
                done = await wait_out_lock(
                    functools.partial(recorder.record, commitment),
                    stopping=self._stopping,
                    log=self._log,
                )
            except RejectedInput as exc:
                self._log.error("commitment_not_journaled", round=commitment.round, error=str(exc))
                done = (False,)
            except ActorStopped:
                done = None
            if done is None:
                self._log.warning(
                    "commitments_wait_in_checkpoint",
                    rounds=[c.round for c in self._held],
                    advice="journaled from the checkpoint when the node starts again",
                )
                return
            self._held.pop(0)
