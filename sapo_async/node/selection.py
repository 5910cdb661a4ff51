"""A node's choice of external groups, in a worker thread, from an immutable snapshot.

Owns the step between the collector's buffer and the trainer: score each candidate with
this node's verifier (re-deriving its task), build its one view
(:class:`~sapo_async.node.view.CandidateView`: the receiver's tokens once, its log-probs at
most once per completion), check it in this order on that view: the size bound in the
receiver's tokens [``completion_too_many_tokens``], the token check
[``token_mismatch``], plausibility, the length and brevity guards and the repetition check
(:func:`~sapo_async.node.defence.screen`) [``implausible``, ``too_long``, ``too_brief``,
``repetitive``],
an experiment's external filter such as F-TIS's ratio [``ratio_extreme``]; and let the pure
sampler pick J (with ``drop_after_answer``, or for a producer the
:class:`~sapo_async.node.tails.TailRecord` finds tailing its rewarded answers, a peer's
completions with text after their closing answer tag are left out of the group first).
The trainer gets the view's group (the receiver's own ids), so nothing tokenises or runs
the candidate again before the gradient step. The view is lazy: with the defences off (and
no external filter) a candidate is tokenised only if the sampler chose it, and no candidate
is run through the model. Staleness is not checked here: the collector owns both bounds
(age and round lag), so its buffer holds only fresh groups.

Threads: :func:`select_groups` may run in a worker thread, so it never touches the
collector. It gets a tuple of buffered groups and a frozen
:class:`~sapo_async.node.defence.Thresholds`, and returns what it decided: the groups chosen
and the ones to drop with their reason. The round loop applies both on the event loop
(:meth:`~sapo_async.fabric.collector.Collector.drop`, ``take`` and ``mark_trained``), so a
flood that inserts while the thread scores cannot race the buffer, and a group that failed
scoring or screening is dropped once instead of being scored again every round.

Deliberately does not know about NATS, the chain, or how verdicts are counted.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from sapo_async.errors import RejectedInput
from sapo_async.fabric.collector import BufferedGroup
from sapo_async.limits import FOREIGN_TOKEN_SLACK
from sapo_async.node.defence import Calibration, CompletionView, Thresholds, screen
from sapo_async.node.groups import SharedRound, round_seed
from sapo_async.node.leads import LeadObservation, LeadRecord
from sapo_async.node.learner import Learner
from sapo_async.node.sampler import ExternalSelection, select_external, select_local
from sapo_async.node.spec import TrainingSpec
from sapo_async.node.tails import TailObservation, TailRecord
from sapo_async.node.view import CandidateView
from sapo_async.policy.grpo.trainer import ScoredGroup
from sapo_async.tasks.reward import lead_key, text_after_answer
from sapo_async.wire.reasons import RejectReason

__all__ = [
    "Candidate",
    "Choice",
    "Verdict",
    "calibrate",
    "candidate_view",
    "pool_key",
    "select_groups",
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
    reason: str


@dataclass(frozen=True, slots=True)
class Choice:
    """What :func:`select_groups` chose, and what the loop must apply and report.

    Attributes:
        local: the I own groups.
        external: the J external ones.
        selection: the sampler's counters.
        newest: newest round held per producer (for the staleness report).
        drops: candidates that failed scoring or screening (drop them once).
        passed: producers of candidates that were screened and kept (one entry each).
        held: candidates left in the buffer unjudged, their family not calibrated yet
            (:meth:`~sapo_async.node.defence.Thresholds.judges`) or their producer on the
            lead record's probation (:meth:`~sapo_async.node.leads.LeadRecord.unproven`).
        tails: the scored groups' tail counts (for the node's
            :class:`~sapo_async.node.tails.TailRecord`; none without one).
        leads: the scored groups' rewarded leads (for the node's
            :class:`~sapo_async.node.leads.LeadRecord`; none without one).
        left_out: completions the draw's scoring left out of their group before judging
            it, by producer and reason (``after_answer``: text after the answer, with
            ``drop_after_answer`` or the tail record; ``stock_lead``: the producer's stock
            lead); what the records cost a peer, counted whether or not the group is then
            chosen (the probation pre-pass, which trains nothing, counts none).
    """

    local: list[ScoredGroup]
    external: list[Candidate]
    selection: ExternalSelection[Candidate]
    newest: dict[str, int]
    drops: list[Verdict] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    held: int = 0
    tails: list[TailObservation] = field(default_factory=list)
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


def candidate_view(learner: Learner, scored: ScoredGroup) -> CandidateView:
    """This node's view of a scored external group (its tokenizer, model and prompt style);
    lazy, see :class:`~sapo_async.node.view.CandidateView`."""
    return CandidateView(
        scored,
        model=learner.model,
        tokenizer=learner.tokenizer,
        tokenizer_id=learner.tokenizer_id,
        add_special_tokens=not learner.settings.chat_template,
        cut_after_answer=learner.settings.cut_after_answer,
    )


def size_bound(limits: Thresholds, *, same_tokenizer: bool) -> int:
    """The most tokens (this node's) a peer's completion may take: the node's own cap for a
    peer with this tokenizer, :data:`~sapo_async.limits.FOREIGN_TOKEN_SLACK` times it for
    one with another (the same text is longer in a less fitting tokenizer)."""
    if same_tokenizer:
        return limits.max_tokens
    return math.ceil(limits.max_tokens * FOREIGN_TOKEN_SLACK)


class _Screened(RejectedInput):
    """A candidate the content defences refused (counted by the sampler as a failure)."""


def select_groups(
    learner: Learner,
    training: TrainingSpec,
    round_: int,
    *,
    local: list[ScoredGroup],
    fresh: tuple[BufferedGroup, ...],
    newest: dict[str, int],
    limits: Thresholds | None,
    tails: TailRecord | None = None,
    served: Mapping[str, int] | None = None,
    leads: LeadRecord | None = None,
) -> Choice:
    """Choose I local and J external groups (safe in a worker thread: see the docstring).

    Args:
        learner: this node's learner (verifier, model, tokenizer).
        training: the node's round settings (I, J, sampler, cap).
        round_: the round (seeds the draw: common random numbers).
        local: this round's own scored groups.
        fresh: the external candidates, a snapshot in a canonical order.
        newest: newest round held per producer.
        limits: the content defences' thresholds (None: defences off).
        tails: this thread's copy of the node's tail record (None: off); updated as
            groups are scored, so a producer can cross within the round.
        served: external groups trained recently per producer, for the balanced draw
            (None: the paper's uniform draw; :mod:`~sapo_async.node.fairness`).
        leads: this thread's copy of the node's stock-lead record (None: off); updated as
            groups are scored, as ``tails`` is.
    """
    rng = random.Random(round_seed(training.seed, learner.settings.node_index, round_, "external"))
    drops: list[Verdict] = []
    passed: list[str] = []

    drop_tailed = learner.settings.drop_after_answer
    seen: list[TailObservation] = []
    led: list[LeadObservation] = []
    left_out: dict[str, dict[str, int]] = {}

    def leave_out(b: BufferedGroup, reason: str, before: ScoredGroup, after: ScoredGroup) -> None:
        if n := len(before.completions) - len(after.completions):
            counts = left_out.setdefault(b.producer, {})
            counts[reason] = counts.get(reason, 0) + n

    def observe_leads(b: BufferedGroup, scored: ScoredGroup) -> None:
        assert leads is not None
        low = min(scored.rewards, default=0.0)
        shown = tuple(lead_key(c.text) for c in scored.completions if c.reward > low)
        led.append(LeadObservation(b.rollout_hash, b.producer, scored.prompt, shown))
        leads.add(led[-1])

    def untailed(b: BufferedGroup, scored: ScoredGroup) -> ScoredGroup:
        if not drop_tailed and (tails is None or not tails.heavy(b.producer)):
            return scored
        # Only completions that end at their answer are trained or judged: a group whose
        # rewarded ones all carry a tail (the inject and tokens attacks) is left with no
        # spread and dropped as uninformative.
        kept = tuple(c for c in scored.completions if not text_after_answer(c.text))
        return dataclasses.replace(scored, completions=kept)

    refused: dict[tuple[object, ...], str] = {}

    def score(b: BufferedGroup) -> _Ranked:
        scored = learner.score_external(b.group)
        # A flood sends one group under many keys: a copy of a group the screens refused
        # this round is refused for the same reason without being screened again (each
        # copy still dropped, and counted against its producer). The key is what a
        # verdict depends on besides the receiver: the group as scored and what the
        # records do to its producer's completions.
        content = (
            scored.prompt,
            scored.tokenizer_id,
            tuple((c.text, c.token_ids, c.finish_reason) for c in scored.completions),
            tails is not None and tails.heavy(b.producer),
            leads.stock(b.producer) if leads is not None else None,
        )
        if (reason := refused.get(content)) is not None:
            raise _Screened(reason)
        try:
            return screened(b, scored)
        except _Screened as exc:
            refused[content] = exc.reason
            raise

    def screened(b: BufferedGroup, scored: ScoredGroup) -> _Ranked:
        whole = scored
        if tails is not None:
            # Only groups with something rewarded count: padding the window with groups
            # of no spread cannot dilute a producer's share.
            top = [c for c in scored.completions if c.reward > min(scored.rewards, default=0.0)]
            if top:
                tailed = sum(1 for c in top if text_after_answer(c.text))
                seen.append(TailObservation(b.rollout_hash, b.producer, tailed, len(top)))
                tails.add(seen[-1])
        untouched, scored = scored, untailed(b, scored)
        leave_out(b, "after_answer", untouched, scored)
        if leads is not None:
            observe_leads(b, scored)  # after the tail record: what would be trained
            if (stock := leads.stock(b.producer)) is not None:
                kept = tuple(c for c in scored.completions if lead_key(c.text) != stock)
                untouched, scored = scored, dataclasses.replace(scored, completions=kept)
                leave_out(b, "stock_lead", untouched, scored)
        # Lazy: only what reads it below (a defence that is on, the external filter, the
        # trainer for a chosen candidate) tokenises the text or runs the model.
        view = candidate_view(learner, scored)
        # Only what GRPO pushes up needs screening: a completion with a reward above the
        # group's floor (a payload rides a positive advantage). Uninformative groups are
        # dropped by the sampler anyway: no forward pass for them.
        floor = min(scored.rewards, default=0.0)  # no completion left: nothing pushed up
        pushed = [i for i, c in enumerate(scored.completions) if c.reward > floor]
        if limits is not None:
            # Every completion is trained on (the low ones pushed down), so the size bound
            # holds for all of them, in this node's tokens, before any forward pass; and
            # for what the records left out too: an oversize completion is refused (and
            # counts toward quarantine) whether or not it would be trained.
            left = len(whole.completions) != len(scored.completions)
            sent = candidate_view(learner, whole) if left else view
            bound = size_bound(limits, same_tokenizer=sent.same_tokenizer)
            if any(len(ids) > bound for ids in sent.sent_token_ids):
                raise _Screened(RejectReason.COMPLETION_TOO_MANY_TOKENS)
            # A same-tokenizer peer's ids must spell its text: what the trainer uses
            # (the view's ids) is then what the peer sent and what every check read.
            if view.same_tokenizer and any(
                scored.completions[i].token_ids is not None and not view.peer_ids_match(i)
                for i in pushed
            ):
                raise _Screened(RejectReason.TOKEN_MISMATCH)
            text_checks = limits.repetition_limit or limits.brevity_guard
            if (limits.needs_logprobs or text_checks) and pushed:
                lps = (
                    [lp.tolist() for lp in view.logprobs(pushed)]
                    if limits.needs_logprobs
                    else [[] for _ in pushed]
                )
                views = [
                    CompletionView(
                        lp,
                        scored.completions[i].reward,
                        view.token_ids[i],
                        scored.completions[i].text,
                    )
                    for i, lp in zip(pushed, lps, strict=True)
                ]
                reason = screen(b.group.task.family, views, limits)
                if reason is not None:
                    raise _Screened(reason)
        # An experiment's or operator's extra filter (``TrainingSpec.external_filter``, e.g.
        # F-TIS's behaviour log-prob ratio: ``filter(view) -> reason | None``), on
        # informative groups only.
        check = training.external_filter
        if check is not None and scored.informative and (dropped := check(view)):
            raise RejectedInput(str(dropped), f"external filter dropped {b.producer}'s group")
        passed.append(b.producer)
        return _Ranked(b, view)

    def on_error(b: BufferedGroup, exc: Exception) -> str:
        reason = (
            str(exc.reason) if isinstance(exc, RejectedInput) else str(RejectReason.SCORE_ERROR)
        )
        drops.append(Verdict(b.rollout_hash, b.producer, reason))
        return reason

    judged = fresh
    if limits is not None and limits.plausibility:
        # Not dropped, not taken: a later round judges them once the family is calibrated
        # (or the collector's staleness bound retires them).
        judged = tuple(b for b in fresh if limits.judges(b.group.task.family))
    if leads is not None and leads.probation:
        # A producer the lead record cannot judge yet is scored for the record only; its
        # groups stay in the buffer (trained once it is judged, while fresh).
        failed: set[bytes] = set()
        for b in judged:
            if leads.unproven(b.producer) and not leads.tried(b.rollout_hash):
                try:
                    observe_leads(b, untailed(b, learner.score_external(b.group)))
                except Exception:  # the draw scores it again and drops it with its reason
                    failed.add(b.rollout_hash)
        judged = tuple(
            b for b in judged if b.rollout_hash in failed or not leads.unproven(b.producer)
        )
    ranked = select_external(
        judged,
        training.external,
        score,
        rng=rng,
        policy=training.sampler,
        per_producer_cap=training.per_producer_cap,
        on_error=on_error,
        served=served,
    )
    selection = ExternalSelection(
        chosen=[r.chosen() for r in ranked.chosen],
        scored=ranked.scored,
        dropped_uninformative=ranked.dropped_uninformative,
        dropped_capped=ranked.dropped_capped,
        failed=ranked.failed,
    )
    return Choice(
        select_local(local, training.local),
        selection.chosen,
        selection,
        newest,
        drops,
        passed,
        held=len(fresh) - len(judged),
        tails=seen,
        leads=led,
        left_out=left_out,
    )
