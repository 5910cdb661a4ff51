"""The round's judge: whether a peer's buffered group is trained on, as ordered stages.

Admission (:mod:`sapo_async.fabric.admission`, :mod:`.admission`) judges what a message
*claims* before it enters the buffer; this module judges what the group *is*, in the round,
under this node's own verifier and model. Each stage is a small method that reads one
:class:`Case` and returns one typed outcome:

* ``None``: keep going;
* :class:`Drop`: refuse the group with a :class:`~sapo_async.wire.reasons.RejectReason`
  (dropped from the buffer once, counted against its producer for quarantine);
* :class:`Held`: leave it in the buffer unjudged, with a :class:`Hold` reason (a later
  round judges it, or the collector retires it as stale);
* :class:`LeaveOut`: train the group without some of its completions, with a
  :class:`LeftOut` reason; the next stages judge what is left.

The stages, in the order :class:`Judge` runs them (docs/admission.md maps them in this
order, and a test keeps the page and :data:`STAGES` the same):

Before the draw, on every buffered candidate (holds only: nothing is scored twice):
  1. ``calibrated``: a producer of another model waits until the family's floors exist
     (:meth:`Thresholds.judges <sapo_async.node.defence.Thresholds.judges>`); one of this
     node's model is judged by the per-token test, which needs none [hold ``uncalibrated``];
  2. ``probation``: the producer has not shown the same words before its answers to two
     questions, or the record can read its share (:meth:`LeadRecord.unproven
     <sapo_async.node.leads.LeadRecord.unproven>`; every group is scored once for the
     record first) [hold ``probation``].

In the draw, on each candidate the seeded sampler reaches, until it has J:
  3. ``score``: re-derive the task and score with this node's verifier [``task_*``,
     ``score_error``];
  4. ``copy``: a copy of a group refused this round gets the same verdict unscreened (a
     flood sends one group under many keys) [its reason];
  5. ``stock_lead``: the lead record sees the group, and leaves out completions showing
     the producer's stock lead [leave out ``stock_lead``];
  6. ``size_bound``: every completion sent within the size bound in this node's tokens
     [``completion_too_many_tokens``];
  7. ``token_check``: a same-tokenizer peer's ids spell its text [``token_mismatch``];
  8. ``screen``: plausibility, the length and brevity guards, the repetition check
     (:func:`~sapo_async.node.defence.screen`) [``repetitive``, ``too_long``,
     ``too_brief``, ``implausible``];
  9. ``external_filter``: an experiment's filter such as F-TIS's ratio
     [``ratio_extreme``].
Between them, *evidence before influence* (:mod:`.quarantine`): a producer the quarantine
has not cleared has its unjudged groups run through stages 3 to 9 now, until it is cleared
or has the quarantine's minimum; while neither cleared nor refused, its groups wait [hold
``evidence``]; if the quarantine will refuse it, none is drawn. Then the draw itself
(:func:`~sapo_async.node.sampler.select_external`): a group whose rewards are all equal is
skipped as uninformative, a producer past ``per_producer_cap`` is skipped, and the first J
left are trained (a group judged for the evidence is not judged again).

The answer cut (``cut_after_answer``) is not a stage: it is how this node *reads* a peer's
completion (:class:`~sapo_async.node.view.CandidateView`), so every stage and the trainer
see the same cut text. The per-producer record the stages read (the stock-lead record) is
used the same way throughout: the selection thread works on a copy and returns what it
observed; the event loop records it.

Deliberately does not know about NATS, the chain, threads or how verdicts are counted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from sapo_async.errors import RejectedInput
from sapo_async.fabric.collector import BufferedGroup
from sapo_async.limits import FOREIGN_TOKEN_SLACK
from sapo_async.node.defence import CompletionView, Thresholds, screen
from sapo_async.node.leads import LeadObservation, LeadRecord
from sapo_async.node.learner import Learner
from sapo_async.node.view import CandidateView
from sapo_async.policy.grpo.trainer import ScoredGroup
from sapo_async.tasks.reward import lead_key
from sapo_async.wire.reasons import RejectReason

__all__ = [
    "STAGES",
    "Case",
    "Drop",
    "Held",
    "Hold",
    "Judge",
    "LeaveOut",
    "LeftOut",
    "Outcome",
    "candidate_view",
    "size_bound",
]


class Hold(StrEnum):
    """Why a candidate waits in the buffer unjudged."""

    UNCALIBRATED = "uncalibrated"
    """Its family has no thresholds yet (too few own completions)."""
    PROBATION = "probation"
    """The stock-lead record cannot judge its producer yet."""
    EVIDENCE = "evidence"
    """The quarantine has not judged its producer yet (its groups are judged for the
    count, none trained: :mod:`.quarantine`)."""


class LeftOut(StrEnum):
    """Why completions of a trained group were left out of it."""

    STOCK_LEAD = "stock_lead"
    """They show their producer's stock lead (:mod:`.leads`)."""


@dataclass(frozen=True, slots=True)
class Drop:
    """Refuse the group."""

    reason: RejectReason


@dataclass(frozen=True, slots=True)
class Held:
    """Leave the group in the buffer, unjudged."""

    reason: Hold


@dataclass(frozen=True, slots=True)
class LeaveOut:
    """Go on with ``kept``: the group without the completions left out for ``reason``."""

    reason: LeftOut
    kept: ScoredGroup


Outcome = Drop | Held | LeaveOut | None
"""What a stage says of a case (None: nothing; the next stage judges it)."""


@dataclass(slots=True)
class Case:
    """One candidate as the stages see it.

    Attributes:
        buffered: the group as buffered.
        whole: its completions as sent, scored by this node (set by ``score``).
        scored: what is left to train after the leave-outs (starts as ``whole``).
        content: what a verdict on it depends on besides this node (the copy memo's key).
    """

    buffered: BufferedGroup
    whole: ScoredGroup | None = None
    scored: ScoredGroup | None = None
    content: tuple[object, ...] | None = None
    _view: CandidateView | None = None

    @property
    def producer(self) -> str:
        return self.buffered.producer

    @property
    def family(self) -> str:
        return self.buffered.group.task.family

    def group(self) -> ScoredGroup:
        """What is left to train (the ``score`` stage has run)."""
        assert self.scored is not None, "the score stage runs first"
        return self.scored


def candidate_view(
    learner: Learner, scored: ScoredGroup, *, cut_after_answer: bool = False
) -> CandidateView:
    """This node's view of a scored external group (its tokenizer, model and prompt style,
    cut after the answer with ``cut_after_answer``); lazy, see
    :class:`~sapo_async.node.view.CandidateView`."""
    return CandidateView(
        scored,
        model=learner.model,
        tokenizer=learner.tokenizer,
        tokenizer_id=learner.tokenizer_id,
        add_special_tokens=not learner.settings.chat_template,
        cut_after_answer=cut_after_answer,
        bf16=learner.trainer.bf16,  # the trainer's precision (node/plausibility.py says why)
        temperature=learner.settings.sampling.temperature,  # the per-token test's null
    )


def size_bound(limits: Thresholds, *, same_tokenizer: bool) -> int:
    """The most tokens (this node's) a peer's completion may take: the node's own cap for a
    peer with this tokenizer, :data:`~sapo_async.limits.FOREIGN_TOKEN_SLACK` times it for
    one with another (the same text is longer in a less fitting tokenizer)."""
    if same_tokenizer:
        return limits.max_tokens
    return math.ceil(limits.max_tokens * FOREIGN_TOKEN_SLACK)


@dataclass(slots=True)
class Judge:
    """One round's judge (safe in a worker thread: it only reads what it is given and
    writes its own tallies).

    Args:
        learner: this node's learner (verifier, model, tokenizer).
        limits: the content thresholds (None: defences off).
        leads: this thread's copy of the stock-lead record (None: off).
        external_filter: ``filter(view) -> reason | None`` (None: none).

    Attributes (the round's tallies, read by the caller):
        passed: ``(producer, rollout_hash)`` of each candidate that passed every stage.
        left_out: completions left out, by producer and reason.
        led: what the lead record saw (for the node's own record).
    """

    learner: Learner
    limits: Thresholds | None
    leads: LeadRecord | None = None
    external_filter: Callable[[CandidateView], RejectReason | None] | None = None
    passed: list[tuple[str, bytes]] = field(default_factory=list)
    left_out: dict[str, dict[str, int]] = field(default_factory=dict)
    led: list[LeadObservation] = field(default_factory=list)
    _refused: dict[tuple[object, ...], RejectReason] = field(default_factory=dict)
    _unscored: set[bytes] = field(default_factory=set)

    # -- the stages, in order (STAGES names them) ----------------------------------------

    def calibrated(self, case: Case) -> Outcome:
        # A peer of this node's model is judged by the per-token test, which needs no
        # calibration; only another model's completions wait for the calibrated floors.
        limits = self.limits
        if limits is None or not limits.plausibility or self.same_model(case):
            return None
        return None if limits.judges(case.family) else Held(Hold.UNCALIBRATED)

    def same_model(self, case: Case) -> bool:
        """Whether the producer says it runs this node's model (then the per-token test's
        null holds for its honest completions; a producer that says otherwise is judged by
        the calibrated floors instead)."""
        return case.buffered.group.model_id == self.learner.model_id

    def probation(self, case: Case) -> Outcome:
        # After prove(): a group that failed scoring goes on to the draw, which drops it
        # with its reason, instead of waiting unjudged.
        leads, b = self.leads, case.buffered
        if leads is None or not leads.unproven(case.producer) or b.rollout_hash in self._unscored:
            return None
        return Held(Hold.PROBATION)

    def prove(self, cases: Iterable[Case]) -> None:
        """Probation's pre-pass, before stage 2 decides: score each buffered group for the
        lead record, once (the record remembers what it scored), so that every producer is
        judged on everything the node holds of it (the verifier only, no forward pass)."""
        leads = self.leads
        if leads is None or not leads.probation:
            return
        for case in cases:
            b = case.buffered
            if not leads.tried(b.rollout_hash):
                try:
                    self._observe_leads(b, self.learner.score_external(b.group))
                except RejectedInput:
                    self._unscored.add(b.rollout_hash)

    def score(self, case: Case) -> Outcome:
        try:
            case.whole = case.scored = self.learner.score_external(case.buffered.group)
        except RejectedInput as exc:
            return Drop(_reason(exc))
        return None

    def copy(self, case: Case) -> Outcome:
        # The key is what a verdict depends on besides the receiver: the group as scored
        # and what the records do to its producer's completions (read before this group
        # is added to them, as the draw reaches it).
        scored, leads = case.group(), self.leads
        case.content = (
            scored.prompt,
            scored.tokenizer_id,
            tuple((c.text, c.token_ids, c.finish_reason) for c in scored.completions),
            leads.stock(case.producer) if leads is not None else None,
        )
        reason = self._refused.get(case.content)
        return Drop(reason) if reason is not None else None

    def stock_lead(self, case: Case) -> Outcome:
        leads, scored = self.leads, case.group()
        if leads is None:
            return None
        self._observe_leads(case.buffered, scored)
        stock = leads.stock(case.producer)
        kept = tuple(c for c in scored.completions if lead_key(c.text) != stock)
        if stock is None or len(kept) == len(scored.completions):
            return None
        return LeaveOut(LeftOut.STOCK_LEAD, dataclasses.replace(scored, completions=kept))

    def size_bound(self, case: Case) -> Outcome:
        # Every completion is trained on (the low ones pushed down), so the bound holds for
        # all, in this node's tokens, before any forward pass; and for what the records
        # left out too: an oversize completion is refused (and counts toward quarantine)
        # whether or not it would be trained.
        if self.limits is None or case.whole is None:
            return None
        left = case.whole is not case.scored
        sent = self._view_of(case.whole) if left else self.view(case)
        bound = size_bound(self.limits, same_tokenizer=sent.same_tokenizer)
        if any(len(ids) > bound for ids in sent.sent_token_ids):
            return Drop(RejectReason.COMPLETION_TOO_MANY_TOKENS)
        return None

    def token_check(self, case: Case) -> Outcome:
        # A same-tokenizer peer's ids must spell its text: what the trainer uses (the
        # view's ids) is then what the peer sent and what every check read.
        if self.limits is None:
            return None
        view, scored = self.view(case), case.group()
        if view.same_tokenizer and any(
            scored.completions[i].token_ids is not None and not view.peer_ids_match(i)
            for i in _pushed(scored)
        ):
            return Drop(RejectReason.TOKEN_MISMATCH)
        return None

    def screen(self, case: Case) -> Outcome:
        # Only what GRPO pushes up needs screening: a completion with a reward above the
        # group's floor (a payload rides a positive advantage).
        limits, scored = self.limits, case.group()
        pushed = _pushed(scored)
        if limits is None or not pushed:
            return None
        if not (limits.needs_logprobs or limits.repetition_limit or limits.brevity_guard):
            return None
        view = self.view(case)
        lps = (
            [lp.tolist() for lp in view.logprobs(pushed)]
            if limits.needs_logprobs
            else [[] for _ in pushed]
        )
        tested = limits.plausibility and self.same_model(case)
        p_values = [t.p_value for t in view.tests(pushed)] if tested else [None] * len(pushed)
        views = []
        for i, lp, p in zip(pushed, lps, p_values, strict=True):
            c = scored.completions[i]
            views.append(
                CompletionView(lp, c.reward, view.token_ids[i], c.text, view.stopped(i), p)
            )
        reason = screen(case.family, views, limits)
        return Drop(reason) if reason is not None else None

    def external_filter_stage(self, case: Case) -> Outcome:
        check = self.external_filter
        if check is None or not case.group().informative:
            return None
        reason = check(self.view(case))
        return Drop(RejectReason(reason)) if reason else None

    # -- running them ---------------------------------------------------------------------

    def run(self, case: Case, stages: Sequence[Callable[[Case], Outcome]]) -> Outcome:
        """``stages`` on ``case`` in order, until one drops or holds it (then that
        outcome; a drop after ``copy`` is remembered for the group's copies); the leave-outs
        applied and counted on the way; None when every stage let it through."""
        for stage in stages:
            outcome = stage(case)
            if isinstance(outcome, LeaveOut):
                before = case.group()
                counts = self.left_out.setdefault(case.producer, {})
                n = len(before.completions) - len(outcome.kept.completions)
                counts[outcome.reason] = counts.get(outcome.reason, 0) + n
                case.scored, case._view = outcome.kept, None
            elif isinstance(outcome, Drop | Held):
                # A copy of a group the screens refused this round is refused without being
                # screened again (an operator's filter may count what it sees: not memoised).
                screened = stage != self.external_filter_stage
                if isinstance(outcome, Drop) and case.content is not None and screened:
                    self._refused[case.content] = outcome.reason
                return outcome
        return None

    def view(self, case: Case) -> CandidateView:
        """The case's lazy view of what is left to train (built once per leave-out)."""
        if case._view is None:
            case._view = self._view_of(case.group())
        return case._view

    def _view_of(self, scored: ScoredGroup) -> CandidateView:
        cut = self.limits is not None and self.limits.cut_after_answer
        return candidate_view(self.learner, scored, cut_after_answer=cut)

    def before_draw(self) -> tuple[Callable[[Case], Outcome], ...]:
        """Stages 1 and 2 (holds; :meth:`prove` runs between them)."""
        return (self.calibrated, self.probation)

    def in_draw(self) -> tuple[Callable[[Case], Outcome], ...]:
        """Stages 3 to 9."""
        return (
            self.score,
            self.copy,
            self.stock_lead,
            self.size_bound,
            self.token_check,
            self.screen,
            self.external_filter_stage,
        )

    def _observe_leads(self, b: BufferedGroup, scored: ScoredGroup) -> None:
        assert self.leads is not None
        low = min(scored.rewards, default=0.0)
        shown = tuple(lead_key(c.text) for c in scored.completions if c.reward > low)
        self.led.append(LeadObservation(b.rollout_hash, b.producer, scored.prompt, shown))
        self.leads.add(self.led[-1])


def _reason(exc: RejectedInput) -> RejectReason:
    """A refusal's reason as the enum (a reason outside it counts as ``score_error``)."""
    try:
        return RejectReason(exc.reason)
    except ValueError:
        return RejectReason.SCORE_ERROR


def _pushed(scored: ScoredGroup) -> list[int]:
    """The completions GRPO pushes up: reward above the group's floor (none left: none)."""
    floor = min(scored.rewards, default=0.0)
    return [i for i, c in enumerate(scored.completions) if c.reward > floor]


STAGES: tuple[str, ...] = (
    "calibrated",
    "probation",
    "score",
    "copy",
    "stock_lead",
    "size_bound",
    "token_check",
    "screen",
    "external_filter",
)
"""The stages' names in the order :class:`Judge` runs them (docs/admission.md's order)."""
