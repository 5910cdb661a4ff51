"""A round's commitment, and the commitments a node holds until a checkpoint covers them.

A commitment names the round and the policy version just trained. Journaled (and so sent)
before a checkpoint holds that state, a node killed then would resume from an older
checkpoint and redo rounds and policy versions the chain already names. So the round loop
holds each commitment here until the next checkpoint is on disk (every round for the tiny
model, every ``checkpoint.every`` rounds at real size: docs/learning.md), then releases them
to the recorder in round order; a node that keeps no checkpoints releases at once.

Deliberately does not know when checkpoints are written (the round loop's business).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from sapo_async.errors import ActorStopped, RejectedInput
from sapo_async.ledger.types import RoundCommitment

if TYPE_CHECKING:
    from sapo_async.ledger.recorder import Recorder
    from sapo_async.node.groups import SharedRound
    from sapo_async.node.selection import Candidate

__all__ = ["HeldCommitments", "round_commitment"]


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
    """Commitments waiting for a checkpoint, released to the recorder in round order."""

    def __init__(self, recorder: Recorder | None, log: Any) -> None:
        self._recorder = recorder
        self._log = log
        self._held: list[RoundCommitment] = []

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, commitment: RoundCommitment) -> None:
        """Keep ``commitment`` until :meth:`release`."""
        self._held.append(commitment)

    async def release(self) -> None:
        """Journal every held commitment (a checkpoint now covers their rounds).

        Each journal write runs shielded: a round that trained is journaled whole or not
        at all. One the recorder refuses is logged and not retried (it would be refused
        again); the rest go on.
        """
        while self._held and self._recorder is not None:
            commitment = self._held.pop(0)
            try:
                with anyio.CancelScope(shield=True):
                    await self._recorder.record(commitment)
            except (RejectedInput, ActorStopped) as exc:
                self._log.error("commitment_not_journaled", round=commitment.round, error=str(exc))
