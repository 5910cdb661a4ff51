"""A node's choice of external groups, in a worker thread, from an immutable snapshot.

Owns the step between the collector's buffer and the trainer: :func:`select_groups` runs
the round's judge (:class:`~sapo_async.node.judge.Judge`: holds on every candidate, then the
stages on each candidate the seeded draw reaches, until it has J) and returns what it
decided. The trainer gets the view's group (the receiver's own ids), so nothing tokenises or
runs the candidate again before the gradient step. The view is lazy: with the defences off
(and no external filter) a candidate is tokenised only if the sampler chose it, and no
candidate is run through the model. Staleness is not checked here: the collector owns both
bounds (age and round lag), so its buffer holds only fresh groups.

Threads: :func:`select_groups` may run in a worker thread, so it never touches the
collector. It gets a tuple of buffered groups, a frozen
:class:`~sapo_async.node.defence.Thresholds` and a copy of the stock-lead record, and
returns what it decided: the groups chosen and the ones to drop with their reason. The
round loop applies both on the event loop
(:meth:`~sapo_async.fabric.collector.Collector.drop`, ``take`` and ``mark_trained``), so a
flood that inserts while the thread scores cannot race the buffer, and a group that failed
scoring or screening is dropped once instead of being scored again every round.

Deliberately does not know about NATS, the chain, or how verdicts are counted.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sapo_async.errors import RejectedInput
from sapo_async.fabric.collector import BufferedGroup
from sapo_async.node.defence import Calibration, Thresholds
from sapo_async.node.groups import SharedRound, round_seed
from sapo_async.node.judge import (
    Case,
    Drop,
    Held,
    Hold,
    Judge,
    Outcome,
    candidate_view,
    size_bound,
)
from sapo_async.node.leads import LeadObservation, LeadRecord
from sapo_async.node.learner import Learner
from sapo_async.node.quarantine import Evidence
from sapo_async.node.sampler import ExternalSelection, select_external, select_local
from sapo_async.node.spec import TrainingSpec
from sapo_async.node.view import CandidateView
from sapo_async.policy.grpo.trainer import ScoredGroup
from sapo_async.wire.reasons import RejectReason

__all__ = [
    "Candidate",
    "Choice",
    "Verdict",
    "calibrate",
    "candidate_view",
    "pool_key",
    "select_groups",
    "size_bound",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """An external group the round chose; ``scored`` is what the trainer gets (the view's
    group: this node's own token ids)."""

    buffered: BufferedGroup
    scored: ScoredGroup

    @property
    def producer(self) -> str:
        return self.buffered.producer

    @property
    def rewards(self) -> list[float]:
        return self.scored.rewards


@dataclass(frozen=True, slots=True)
class _Ranked:
    """A scored candidate as the sampler sees it: this node's rewards, and its view, which
    tokenises nothing until a defence or the trainer reads it."""

    buffered: BufferedGroup
    view: CandidateView

    @property
    def producer(self) -> str:
        return self.buffered.producer

    @property
    def rewards(self) -> list[float]:
        return self.view.scored.rewards

    def chosen(self) -> Candidate:
        """The candidate the trainer gets (tokenised here, in the worker thread, if no
        defence has already)."""
        return Candidate(self.buffered, self.view.trained_group())


@dataclass(frozen=True, slots=True)
class Verdict:
    """A candidate to drop: its hash, producer and the reason."""

    rollout_hash: bytes
    producer: str
    reason: RejectReason


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`select_groups` chose, and what the loop must apply and report.

    Attributes:
        local: the I own groups.
        external: the J external ones.
        selection: the sampler's counters.
        newest: newest round held per producer (for the staleness report).
        drops: candidates that failed scoring or screening (drop them once).
        passed: ``(producer, rollout_hash)`` of each candidate screened and kept.
        held: candidates left in the buffer untrained, by :class:`~sapo_async.node.judge.Hold`
            reason (their family not calibrated yet, their producer on the lead record's
            probation, or short of the quarantine's evidence).
        leads: the scored groups' rewarded leads (for the node's
            :class:`~sapo_async.node.leads.LeadRecord`; none without one).
        left_out: completions the judge left out of their group before judging the rest,
            by producer and :class:`~sapo_async.node.judge.LeftOut` reason; what the
            records cost a peer, counted whether or not the group is then chosen (the
            probation pre-pass, which trains nothing, counts none).
    """

    local: list[ScoredGroup]
    external: list[Candidate]
    selection: ExternalSelection[Candidate]
    newest: dict[str, int]
    drops: list[Verdict] = field(default_factory=list)
    passed: list[tuple[str, bytes]] = field(default_factory=list)
    held: dict[Hold, int] = field(default_factory=dict)
    leads: list[LeadObservation] = field(default_factory=list)
    left_out: dict[str, dict[str, int]] = field(default_factory=dict)


def pool_key(b: BufferedGroup) -> tuple[str, int, str, str, int, int, bytes]:
    """A candidate's place in the pool's canonical order, which the seeded draw reads: what
    the group is (producer, round, task), not when it was made. The rollout hash covers
    ``created_at_ms``, so an order by hash alone differed from run to run, and two runs of
    one seed (an attack and its no-attack control) drew different groups from the same
    pool: no common random numbers. The hash only breaks ties (copies of one group)."""
    g = b.group
    task = g.task
    return (
        g.producer,
        g.producer_round,
        task.family,
        task.config_digest,
        task.seed,
        task.index,
        b.rollout_hash,
    )


def calibrate(calibration: Calibration, shared: SharedRound) -> None:
    """Feed a round's own completions (behaviour log-probs, own rewards) to the thresholds."""
    for g, scored in zip(shared.generated, shared.local, strict=True):
        for c, s in zip(g.result.completions, scored.completions, strict=True):
            calibration.observe(
                g.item.ref.family, c.logprobs or (), s.reward, s.text, c.finish_reason
            )


class _Refused(RejectedInput):
    """A candidate the judge dropped (counted by the sampler as a failure)."""


@dataclass(slots=True)
class _Verdicts:
    """One round's judge as :func:`select_groups` runs it: holds, verdicts (each group
    judged at most once a round) and drops."""

    judge: Judge
    drops: list[Verdict] = field(default_factory=list)
    held: dict[Hold, int] = field(default_factory=dict)
    judged: dict[bytes, _Ranked] = field(default_factory=dict)

    def hold(self, cases: list[Case], stage: Callable[[Case], Outcome]) -> list[Case]:
        """``cases`` less those ``stage`` holds (counted by reason)."""
        kept = []
        for case in cases:
            if isinstance(outcome := self.judge.run(case, (stage,)), Held):
                self.held[outcome.reason] = self.held.get(outcome.reason, 0) + 1
            else:
                kept.append(case)
        return kept

    def run(self, case: Case) -> _Ranked | None:
        """Stages 3 to 9 on ``case``, its verdict kept (None: dropped)."""
        judge, digest = self.judge, case.buffered.rollout_hash
        outcome = judge.run(case, judge.in_draw())
        if isinstance(outcome, Drop):
            self.drops.append(Verdict(digest, case.producer, outcome.reason))
            return None
        judge.passed.append((case.producer, digest))
        ranked = self.judged[digest] = _Ranked(case.buffered, judge.view(case))
        return ranked

    def drawn(self, case: Case) -> _Ranked:
        """What the draw reaches: the case judged (once), or refused."""
        ranked = self.judged.get(case.buffered.rollout_hash) or self.run(case)
        if ranked is None:
            raise _Refused(self.drops[-1].reason)
        return ranked

    def vet(self, cases: list[Case], evidence: Evidence) -> list[Case]:
        """Evidence before influence (:mod:`~sapo_async.node.quarantine`): for each
        producer the quarantine has not cleared, judge its groups that have no verdict, in
        pool order, until it is cleared or has the quarantine's minimum. Returns the cases
        the draw may reach: every case of a cleared producer (those dropped here are
        gone); the others' are left out, held as ``evidence`` while their producer is
        neither cleared nor refused."""
        by_producer: dict[str, list[Case]] = {}
        for case in cases:
            by_producer.setdefault(case.producer, []).append(case)
        kept: list[Case] = []
        for producer, own in by_producer.items():
            if evidence.cleared(producer):
                kept.extend(own)
                continue
            before, short = evidence.judged(producer), evidence.short(producer)
            new: list[bool] = []
            left: list[Case] = []
            for case in own:
                judging = len(new) < short and not evidence.cleared(producer, new)
                if judging and case.buffered.rollout_hash not in before:
                    new.append(self.run(case) is None)
                    if new[-1]:
                        continue
                left.append(case)
            if evidence.cleared(producer, new):
                kept.extend(left)
            elif not evidence.refuses(producer, new):  # refused: the loop quarantines it
                self.held[Hold.EVIDENCE] = self.held.get(Hold.EVIDENCE, 0) + len(left)
        return kept


def select_groups(
    learner: Learner,
    training: TrainingSpec,
    round_: int,
    *,
    local: list[ScoredGroup],
    fresh: tuple[BufferedGroup, ...],
    newest: dict[str, int],
    limits: Thresholds | None,
    leads: LeadRecord | None = None,
    evidence: Evidence | None = None,
) -> Choice:
    """Choose I local and J external groups (safe in a worker thread: see the docstring).

    Args:
        learner: this node's learner (verifier, model, tokenizer).
        training: the node's round settings (I, J, sampler, cap, external filter).
        round_: the round (seeds the draw: common random numbers).
        local: this round's own scored groups.
        fresh: the external candidates, a snapshot in a canonical order (:func:`pool_key`).
        newest: newest round held per producer.
        limits: the content defences' thresholds (None: defences off).
        leads: this thread's copy of the node's stock-lead record (None: off); updated as
            groups are scored, so a producer can cross within the round.
        evidence: the quarantine's verdicts on the pool's producers (None: every producer
            may be drawn at once; defences off). A producer the quarantine has not cleared
            has its groups judged for the count first (``_Verdicts.vet``), and is drawn
            only once it is cleared.
    """
    judge = Judge(learner, limits, leads, training.external_filter)
    verdicts = _Verdicts(judge)
    first, second = judge.before_draw()
    cases = verdicts.hold([Case(b) for b in fresh], first)
    judge.prove(cases)
    cases = verdicts.hold(cases, second)
    if evidence is not None:
        cases = verdicts.vet(cases, evidence)

    rng = random.Random(round_seed(training.seed, learner.settings.node_index, round_, "external"))
    ranked = select_external(
        cases,
        training.external,
        verdicts.drawn,
        rng=rng,
        policy=training.sampler,
        per_producer_cap=training.per_producer_cap,
        on_error=lambda _, exc: str(exc.reason),
    )
    selection = ExternalSelection(
        chosen=[r.chosen() for r in ranked.chosen],
        scored=ranked.scored,
        dropped_uninformative=ranked.dropped_uninformative,
        dropped_capped=ranked.dropped_capped,
        failed=Counter(str(v.reason) for v in verdicts.drops),  # the draw's and the vetting's
    )
    return Choice(
        select_local(local, training.local),
        selection.chosen,
        selection,
        newest,
        verdicts.drops,
        judge.passed,
        held=verdicts.held,
        leads=judge.led,
        left_out=judge.left_out,
    )
