"""The collector's admission pipeline: small pure checks, in order, each with one reason.

Owns the check protocol and the wire-level checks. A check reads one :class:`Arrival` (a
decoded group, its hash, where it came from and what the collector already knows of its
producer) and either returns (admit, go on) or raises
:class:`~sapo_async.errors.RejectedInput` with one :class:`~sapo_async.errors.RejectReason`.
Each check declares its :class:`Stage`: before the signature is recovered (cheap checks of
what a message *claims*, so a flood costs no secp256k1 work) or after it (checks that may
only act on a verified producer). The collector runs the stages in the order
docs/admission.md lists; node-level checks (preset, sizes, producer-round cap, quarantine:
:mod:`sapo_async.node.admission`) are given to the collector's constructor by whoever
builds the node, in the same protocol. A check that also counts what was admitted (the
producer-round cap) implements :class:`CountsAdmitted`; the collector tells it only about
groups it admitted, so unverified claims never move a counter.

Deliberately does not know about the buffer, tasks or models: the collector owns the
buffer and its replay sets; content checks happen later, in the round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from sapo_async.errors import RejectedInput
from sapo_async.fabric.transport.base import validate_token
from sapo_async.fabric.transport.shards import parse_rollouts_subject, producer_leaf
from sapo_async.wire.reasons import RejectReason
from sapo_async.wire.rollout import RolloutGroup

__all__ = [
    "AgeCheck",
    "Arrival",
    "Check",
    "CountsAdmitted",
    "MessageIdCheck",
    "RoundLagCheck",
    "ShapeCheck",
    "Stage",
    "SubjectCheck",
    "SwarmCheck",
    "by_stage",
]

_FINISH_REASONS = frozenset({"stop", "length"})


class Stage(Enum):
    """When a check runs: on the claim, or on the verified producer."""

    BEFORE_SIGNATURE = "before_signature"
    AFTER_SIGNATURE = "after_signature"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One decoded message as the checks see it.

    Attributes:
        group: the strictly decoded group (its producer is a claim before the signature).
        rollout_hash: keccak-256 of the body (32 bytes).
        subject: the subject it came on, if the transport said.
        msg_id: the transport's message id (claimed rollout hash, hex), if any.
        now: the collector's clock, unix seconds.
        newest_round: the newest round the collector admitted from this producer (None:
            none yet).
    """

    group: RolloutGroup
    rollout_hash: bytes
    subject: str | None
    msg_id: str | None
    now: float
    newest_round: int | None


class Check(Protocol):
    """A small pure admission check: returns to go on, raises ``RejectedInput`` to refuse."""

    @property
    def stage(self) -> Stage: ...

    def __call__(self, arrival: Arrival) -> None: ...


@runtime_checkable
class CountsAdmitted(Protocol):
    """A check that also counts what the collector admitted (called after admission)."""

    def admitted(self, arrival: Arrival) -> None: ...


def by_stage(checks: Sequence[Check], stage: Stage) -> tuple[Check, ...]:
    """The checks of one stage, in the given order."""
    return tuple(c for c in checks if c.stage is stage)


@dataclass(frozen=True, slots=True)
class SwarmCheck:
    """The group names this swarm [``wrong_swarm``]."""

    swarm: str
    stage: Stage = Stage.BEFORE_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        if arrival.group.swarm != self.swarm:
            raise RejectedInput(
                RejectReason.WRONG_SWARM, f"{arrival.group.swarm!r} is not {self.swarm!r}"
            )


@dataclass(frozen=True, slots=True)
class ShapeCheck:
    """Field-level sanity the schema types cannot express [``invalid_group``]."""

    stage: Stage = Stage.BEFORE_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        group = arrival.group
        bad = RejectReason.INVALID_GROUP
        if not group.completions:
            raise RejectedInput(bad, "no completions")
        try:
            validate_token(group.task.family, field="family")
        except ValueError as exc:
            raise RejectedInput(bad, str(exc)) from exc
        if not (group.producer.startswith("0x") and len(group.producer) == 42):
            raise RejectedInput(bad, f"producer {group.producer[:50]!r} is not an address")
        for completion in group.completions:
            if completion.finish_reason not in _FINISH_REASONS:
                raise RejectedInput(bad, f"finish_reason {completion.finish_reason[:20]!r}")
            ids, lps = completion.token_ids, completion.logprobs
            if ids is not None and lps is not None and len(ids) != len(lps):
                raise RejectedInput(bad, "token_ids and logprobs differ in length")
            # max and sum in C, not a generator per value (every flood message pays this
            # before the producer-round cap): NaN survives a sum, +inf fails the max.
            if lps and (not (max(lps) <= 0.0) or math.isnan(sum(lps))):
                raise RejectedInput(bad, "a log-probability is positive or NaN")


@dataclass(frozen=True, slots=True)
class SubjectCheck:
    """The subject matches the group's family [``wrong_subject``] and is the producer's
    leaf [``wrong_shard``]: on a stream that takes leaves, a legacy family subject is
    nobody's leaf, so a producer cannot skip the shard rule by publishing there. Only on a
    stream from before sharding (``leaves`` False: every group is on its family subject,
    and every reader reads it all) does the legacy subject pass."""

    swarm: str
    leaves: bool = True
    stage: Stage = Stage.BEFORE_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        subject, group = arrival.subject, arrival.group
        if subject is None:
            return
        where = parse_rollouts_subject(self.swarm, subject)
        if where is None or where[0] != group.task.family:
            raise RejectedInput(
                RejectReason.WRONG_SUBJECT, f"{group.task.family!r} arrived on {subject!r}"
            )
        # The leaf is a function of (family, producer): a group on another leaf, or on no
        # leaf where the stream takes them, is a producer spraying shards it does not
        # belong to (or a node from before sharding, counted rather than trained on).
        leaf = producer_leaf(where[0], group.producer)
        if where[1] is None and self.leaves:
            raise RejectedInput(
                RejectReason.WRONG_SHARD,
                f"{group.producer} published on the legacy subject {subject!r}, not on its "
                f"leaf {leaf}",
            )
        if where[1] is not None and where[1] != leaf:
            raise RejectedInput(
                RejectReason.WRONG_SHARD, f"{group.producer} is not on leaf {where[1]}"
            )


@dataclass(frozen=True, slots=True)
class MessageIdCheck:
    """The transport's message id is the rollout hash [``hash_mismatch``]."""

    stage: Stage = Stage.BEFORE_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        msg_id = arrival.msg_id
        if msg_id is not None and msg_id != arrival.rollout_hash.hex():
            raise RejectedInput(
                RejectReason.HASH_MISMATCH,
                f"message id {msg_id[:80]!r} is not the rollout hash",
            )


@dataclass(frozen=True, slots=True)
class AgeCheck:
    """The group's time stamp is neither in the future [``from_future``] nor older than the
    buffer's age bound [``stale_age``]. The one owner of the age bound (the buffer evicts
    by the same ``max_age_s``)."""

    max_age_s: float
    max_skew_s: float
    stage: Stage = Stage.AFTER_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        age_s = arrival.now - arrival.group.created_at_ms / 1000
        if age_s < -self.max_skew_s:
            raise RejectedInput(RejectReason.FROM_FUTURE, f"created {-age_s:.0f} s in the future")
        if age_s > self.max_age_s:
            raise RejectedInput(
                RejectReason.STALE_AGE, f"{age_s:.0f} s old > {self.max_age_s:.0f} s"
            )


@dataclass(frozen=True, slots=True)
class RoundLagCheck:
    """The group's round is at most ``max_round_lag`` behind the newest admitted from its
    producer [``stale_round``]. The one owner of the round-staleness bound (the node sets
    it to ``training.max_staleness_rounds``; the buffer evicts by the same lag when a newer
    round arrives, so the sampler only ever sees fresh groups)."""

    max_round_lag: int
    stage: Stage = Stage.AFTER_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        newest, rnd = arrival.newest_round, arrival.group.producer_round
        if newest is not None and rnd < newest - self.max_round_lag:
            raise RejectedInput(RejectReason.STALE_ROUND, f"round {rnd} < {newest} - lag")
