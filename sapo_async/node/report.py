"""What a node's rounds report: one :class:`RoundReport` per round, and their history.

Owns the report's shape (the one type the round loop builds and the status view, the
metrics and the command line read), :class:`NodeStats` (a node's totals) and
:class:`RoundHistory`, the bounded list of reports that readers follow as rounds finish.

Per-round counts (``groups_shared``, ``groups_received``, ``rejections``) cover that round
only; ``commitments_pending`` and ``commitments_confirmed`` are the recorder's current
totals (the recorder knows them, the round does not).

Deliberately does not know how a round runs (:mod:`.rounds`) nor how reports are shown
(:mod:`sapo_async.ops.status`, :mod:`sapo_async.ops.metrics`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from sapo_async.errors import ActorStopped, SapoError
from sapo_async.pulse import Pulse
from sapo_async.wire.reasons import AFTER_ADMISSION

if TYPE_CHECKING:
    from sapo_async.policy.grpo.trainer import ScoredGroup

__all__ = [
    "DropRates",
    "NodeStats",
    "RoundHistory",
    "RoundReport",
    "drop_rates",
    "rewards_by_family",
]

HISTORY_SIZE = 10_000
"""Reports a node keeps: ten thousand rounds is days of a real model, a few MB of memory."""


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What one round of one node did.

    Attributes:
        node: the node's address.
        name: the node's human name.
        round: the round index (starts at 0, strictly increasing).
        policy_version: optimizer steps taken after this round.
        reward_mean: mean reward of the node's own completions this round, by its own
            verifier (the *training reward* the SAPO paper plots and sums).
        informative_local: own groups whose rewards differ.
        local_used: own groups trained on (I, or fewer).
        groups_shared: groups published and acknowledged this round.
        groups_received: external groups admitted to the buffer this round.
        external_used: external groups trained on, by producer address.
        external_scored: external candidates scored to find them.
        external_uninformative: of those, dropped for all-equal rewards.
        external_failed: candidates dropped at scoring, by reason (e.g. task_mismatch).
        external_held: candidates left in the buffer untrained this round (docs/admission.md).
        external_held_by: the same by reason (:class:`~sapo_async.node.judge.Hold`:
            ``uncalibrated``, ``probation``, ``evidence``).
        external_left_out: completions left out of the external groups scored this round
            before they were judged, by producer and reason
            (:class:`~sapo_async.node.judge.LeftOut`: ``stock_lead``).
        staleness_rounds: mean of (producer's newest round - group's round) over the
            external groups used (0 = all fresh).
        rejections: external groups the collector rejected this round, by reason
            (``bad_signature``, ``stale``...).
        commitments_pending / commitments_confirmed: ledger journal totals now (0 without
            a ledger).
        stream_missing: the swarm's stream was gone when this round published (and the
            node may not recreate it): its groups were not shared, it trained on its own.
        backlog_wait_s: seconds this round waited, before it began, for the node's pending
            commitments to fall within ``ledger.max_pending`` (0: no pause).
        max_pending: the node's ``ledger.max_pending`` (readers of the log, such as the
            explorer, tell from it and the journal whether the node's rounds pause now).
        generate_s / publish_s / score_s / train_s: wall time of each phase.
        step: the trainer's metrics (flat dict).
        external_staleness: (producer's newest round - group's round) of each external
            group used, in the order trained on.
        reward_by_family: ``{family: [sum, count]}`` of the rewards of this round's own
            completions, per task family.
        quarantined: producers this node refuses now (docs/security.md, quarantine).
        generated_tokens: completion tokens the node sampled this round.
    """

    node: str
    name: str
    round: int
    policy_version: int
    reward_mean: float
    informative_local: int
    local_used: int
    groups_shared: int
    groups_received: int
    external_used: dict[str, int]
    external_scored: int
    external_uninformative: int
    external_failed: dict[str, int]
    staleness_rounds: float
    rejections: dict[str, int]
    commitments_pending: int
    commitments_confirmed: int
    generate_s: float
    publish_s: float
    score_s: float
    train_s: float
    step: dict[str, Any] = field(default_factory=dict)
    external_staleness: list[int] = field(default_factory=list)
    reward_by_family: dict[str, list[float]] = field(default_factory=dict)
    quarantined: tuple[str, ...] = ()
    generated_tokens: int = 0
    backlog_wait_s: float = 0.0
    stream_missing: bool = False
    max_pending: int | None = None
    external_held: int = 0
    external_held_by: dict[str, int] = field(default_factory=dict)
    external_left_out: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def external_total(self) -> int:
        """External groups trained on this round (J achieved)."""
        return sum(self.external_used.values())

    @property
    def round_s(self) -> float:
        """Wall-clock seconds of the round's phases together."""
        return self.generate_s + self.publish_s + self.score_s + self.train_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (for the per-node JSONL log)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NodeStats:
    """Totals of a node (what it published and consumed), for audits and tests.

    Attributes:
        rounds: rounds completed.
        published: groups published and acknowledged.
        used_by_producer: external groups trained on, by producer, over all rounds, for
            the :data:`~sapo_async.limits.PRODUCERS_REMEMBERED` producers trained on most
            recently (keys are free: older ones are forgotten).
    """

    rounds: int
    published: int
    used_by_producer: dict[str, int]


@dataclass(frozen=True, slots=True)
class DropRates:
    """How often the round's checks dropped groups the collectors admitted, per reason.

    Attributes:
        admitted: groups admitted (each is dropped at most once).
        dropped: groups dropped after admission, by reason: every reason of
            :data:`~sapo_async.wire.reasons.AFTER_ADMISSION`, zeros included.
    """

    admitted: int
    dropped: dict[str, int]

    def rate(self, reason: str) -> float:
        """Drops for ``reason`` per admitted group (0 when none was admitted). Where every
        producer is honest each drop is a false positive: this is the check's honest
        false-positive rate."""
        return self.dropped.get(reason, 0) / self.admitted if self.admitted else 0.0


def drop_rates(collectors: Iterable[tuple[int, Mapping[str, int]]]) -> DropRates:
    """Sum ``(admitted, dropped by reason)`` over nodes (their collectors' statistics)."""
    admitted = 0
    dropped = dict.fromkeys(map(str, AFTER_ADMISSION), 0)
    for accepted, by_reason in collectors:
        admitted += accepted
        for reason, n in by_reason.items():
            dropped[reason] = dropped.get(reason, 0) + n
    return DropRates(admitted, dropped)


class RoundHistory:
    """The reports of one node's rounds, kept (the last :data:`HISTORY_SIZE`) and followed.

    Args:
        name: the node's name (for errors).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._reports: deque[RoundReport] = deque(maxlen=HISTORY_SIZE)
        self._count = 0
        self._new = Pulse()
        self._done = False
        self._failure: BaseException | None = None

    @property
    def reports(self) -> list[RoundReport]:
        """The reports kept, oldest first."""
        return list(self._reports)

    @property
    def count(self) -> int:
        """Reports added so far (kept or not)."""
        return self._count

    @property
    def failure(self) -> BaseException | None:
        """What ended the rounds, if they failed."""
        return self._failure

    def add(self, report: RoundReport) -> None:
        """Keep ``report`` and wake everyone following."""
        self._reports.append(report)
        self._count += 1
        self._new.fire()

    def close(self, failure: BaseException | None = None) -> None:
        """No more reports will come (``failure``: the error that ended the rounds)."""
        self._done = True
        self._failure = self._failure or failure
        self._new.fire()

    def _check_open(self) -> bool:
        if self._failure is not None:
            raise SapoError(f"node {self._name} failed: {self._failure}") from self._failure
        return not self._done

    async def follow(self) -> AsyncIterator[RoundReport]:
        """Yield every report from the first one kept, then each new one, until closed.

        Raises:
            SapoError: the rounds failed (the original error is the cause).
        """
        index = 0
        while True:
            first = self._count - len(self._reports)
            index = max(index, first)
            while index < self._count:
                yield self._reports[index - first]
                index += 1
                first = self._count - len(self._reports)
            if not self._check_open():
                return
            await self._new.wait()

    async def wait_count(self, count: int, *, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until ``count`` reports were added.

        Raises:
            TimeoutError: not in time.
            ActorStopped: closed first.
            SapoError: the rounds failed.
        """
        with anyio.fail_after(timeout):
            while self._count < count:
                if not self._check_open():
                    raise ActorStopped(self._name, "stopped")
                await self._new.wait()


def rewards_by_family(groups: Sequence[ScoredGroup]) -> dict[str, list[float]]:
    """``{family: [sum, count]}`` of the rewards of ``groups``' completions
    (:attr:`RoundReport.reward_by_family`)."""
    by_family: dict[str, list[float]] = {}
    for g in groups:
        fam = by_family.setdefault(g.task.family if g.task else "", [0.0, 0.0])
        fam[0] += sum(c.reward for c in g.completions)
        fam[1] += len(g.completions)
    return by_family
