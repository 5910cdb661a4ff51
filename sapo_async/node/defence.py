"""What a node refuses from validly signed peers: one small pure policy per defence.

Signatures prove who sent a group, not that it is worth training on (docs/security.md).
The receiver re-derives the task and scores with its own verifier, so a group whose
completions carry the right answer *plus* a payload earns full reward, and GRPO amplifies
the payload. Each policy here answers one question, takes data and returns data:

* :class:`Calibration` and :func:`screen`: is an external completion plausible under the
  node's own model (a peer of its model: the per-token test, :mod:`.token_test`; another
  model's: its mean token log-prob and the mean of its few least likely tokens against
  floors from the node's own completions per family, pooled while a family has too few,
  its groups held before the pool has enough: :meth:`Thresholds.judges`), not needlessly
  long or brief against the node's own rewarded lengths and leads, and not padded with a
  repeated pattern? [``implausible``, ``too_long``, ``too_brief``, ``repetitive``].

How many verdicts a producer must have before its groups are trained, and when it is
refused for a while, is :mod:`.quarantine`'s.

The admission checks on what a message claims (preset, sizes, producer-round cap) are the
collector's pipeline (:mod:`.admission`). Deliberately does not know about models, NATS or
threads: the node computes log-probs once per candidate (:mod:`.view`), hands a worker
thread a frozen :class:`Thresholds` snapshot, and applies verdicts on the event loop.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sapo_async.limits import (
    BREVITY_FACTOR,
    BREVITY_QUANTILE,
    LENGTH_FACTOR,
    LENGTH_QUANTILE,
    PLAUSIBILITY_LOW_TOKENS,
    PLAUSIBILITY_MARGIN,
    PLAUSIBILITY_QUANTILE,
    TOKEN_TEST_LEVEL,
)
from sapo_async.node.spec import DefenceSpec
from sapo_async.tasks.reward import answer_lead, own_lead
from sapo_async.wire.reasons import RejectReason

__all__ = [
    "Calibration",
    "CompletionView",
    "FamilyThresholds",
    "Thresholds",
    "length_buckets",
    "low_mean",
    "repeated_span",
    "screen",
]

REPETITION_MAX_PERIOD = 4
"""The longest token pattern :func:`repeated_span` looks for: ``" ."`` padding is one
SmolLM2 token, ``" . ,"`` two, a padding phrase a few more."""

CALIBRATION_WINDOW = 2048
"""Own completions remembered per family: a few dozen rounds of B x L = 64, recent enough to
follow the model as it learns, long enough for a stable 1 % quantile."""

BREVITY_MIN_LEADS = 8
"""The fewest own completions that show a lead (:func:`~sapo_async.tasks.reward.own_lead`)
the brevity floor is taken over (or ``calibration_min``, if smaller), once
``calibration_min`` own completions are seen. A model
that seldom answers within its cap (the tiny model: about 1 in 25) is judged by the guard
as soon as it has 8 answers; their 5th percentile is then their least lead, so one bare
answer among them puts the floor at 0."""


def low_mean(logprobs: Sequence[float], k: int) -> float:
    """The mean of the ``k`` lowest of ``logprobs`` (all of them when fewer).

    A payload appended to a right answer is a few tokens the model finds very unlikely
    among many it finds certain: on SmolLM2 ``" <answer>11</answer> (*)(*)"`` has a mean
    token log-prob of -4.3, inside the node's own range (its 1 % quantile is -4.0), but its
    three least likely tokens average -14, below every one of 128 own completions (lowest
    -11.8; docs/security.md).
    """
    return sum(sorted(logprobs)[:k]) / min(k, len(logprobs))


def length_buckets(max_tokens: int) -> tuple[int, ...]:
    """The completion lengths the low-token floor is calibrated at: 8, 16, 32... up to the
    first at or above ``max_tokens``.

    The few least likely of n sampled tokens are lower the larger n is (SmolLM2 on one-digit
    sums, own completions resampled to n tokens: the 1 % quantile of the 3 lowest is -11.8
    at 32 tokens, -14.4 at 128, -16.3 at 512), so a floor measured on long own completions
    would let a short payload through. Each bucket's floor is measured on own completions'
    first ``bucket`` tokens, and a candidate of n tokens meets the floor of the smallest
    bucket of at least n (a little lenient, never stricter than its own length warrants).
    """
    out = [8]
    while out[-1] < max_tokens:
        out.append(out[-1] * 2)
    return tuple(out)


def repeated_span(token_ids: Sequence[int], max_period: int = REPETITION_MAX_PERIOD) -> int:
    """The most tokens a pattern of 1 to ``max_period`` tokens covers by repeating itself.

    A stretch where every token equals the one ``p`` positions before it is a pattern of
    ``p`` tokens repeated; the span counts the pattern's first copy too. The length
    attack's pad (``" ."`` to the completion cap) spans nearly the whole completion (31 of
    SmolLM2's 32 tokens); honest text rarely repeats itself past a few tokens (a model
    stuck in a loop does, and earns nothing for it).
    """
    best = 0
    for p in range(1, max_period + 1):
        run = 0
        for i in range(p, len(token_ids)):
            run = run + 1 if token_ids[i] == token_ids[i - p] else 0
            if run:
                best = max(best, run + p)
    return best


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered))))]


@dataclass(frozen=True, slots=True)
class FamilyThresholds:
    """One family's limits, measured on the node's own completions.

    Attributes:
        min_mean_logprob: a completion's mean token log-prob must be at least this (None:
            not calibrated yet, or the check is off).
        max_rewarded_tokens: a rewarded completion must be at most this long (None: same).
        low_floors: ``(bucket, floor)`` pairs, buckets ascending: the mean of a
            completion's :data:`~sapo_async.limits.PLAUSIBILITY_LOW_TOKENS` least likely
            tokens must be at least the floor of the smallest bucket at or above its
            length (the largest when it is
            longer; empty: not calibrated yet, or the check is off; see
            :func:`length_buckets`).
        min_rewarded_lead: a rewarded completion must show at least this many characters
            before its answer (:func:`~sapo_async.tasks.reward.answer_lead`; None: not
            calibrated yet, or the brevity guard is off).
    """

    min_mean_logprob: float | None
    max_rewarded_tokens: float | None
    low_floors: tuple[tuple[int, float], ...] = ()
    min_rewarded_lead: float | None = None

    def low_floor(self, tokens: int) -> float | None:
        """The low-token floor for a completion of ``tokens`` tokens (None: no check)."""
        for bucket, floor in self.low_floors:
            if bucket >= tokens:
                return floor
        return self.low_floors[-1][1] if self.low_floors else None


@dataclass(frozen=True, slots=True)
class Thresholds:
    """A frozen snapshot of every family's limits (what a worker thread is handed).

    Attributes:
        families: limits by family name.
        max_tokens: the node's own completion cap (``max_new_tokens``, plus the EOS token):
            the round's size bound, checked on every candidate before :func:`screen`.
        plausibility / length_guard: which checks are on.
        low_tokens: :data:`~sapo_async.limits.PLAUSIBILITY_LOW_TOKENS`.
        repetition_limit: a pushed-up completion whose :func:`repeated_span` reaches this
            many tokens is dropped (0: off; needs no calibration and no forward pass).
        pooled: the plausibility floors of all own completions together, for a family
            with too few of its own (None: the pool is short too, or the check is off;
            never a length limit: rewarded lengths differ too much between families), and
            the brevity floor of all own completions (how much a model writes before its
            answer is its habit more than the family's).
        brevity_guard: whether :func:`screen` drops needlessly brief rewarded completions.
        cut_after_answer: peers' completions are read only through their closing answer
            tag (:class:`~sapo_async.node.view.CandidateView`): every check and the trainer
            see the cut text.
    """

    families: dict[str, FamilyThresholds]
    max_tokens: int
    plausibility: bool
    length_guard: bool
    low_tokens: int = 0
    repetition_limit: int = 0
    pooled: FamilyThresholds | None = None
    brevity_guard: bool = False
    cut_after_answer: bool = False

    @property
    def needs_logprobs(self) -> bool:
        """Whether :func:`screen` will read log-probs (else the forward pass is skipped)."""
        return self.plausibility or self.length_guard

    def judges(self, family: str) -> bool:
        """Whether another model's peers' groups of ``family`` may be screened now: always
        with plausibility off, else once the node has calibrated it on its own completions,
        or has enough own completions of all families together (:attr:`pooled`).

        An unjudged family's groups must not be trained on yet (the caller holds them in
        the buffer): admitting them unscreened let SmolLM2's first four rounds (B x L = 8,
        calibration_min 32) train on an attacker's payload, after which the poisoned model
        found the payload plausible (docs/security.md). The pool shortens the wait where
        families are mixed: with three families and 16 own completions a round, each
        family alone needs about 6 rounds, the pool 2. The length guard does not hold groups: a
        node that rarely earns a reward may take many rounds to measure its rewarded
        lengths; the size bound applies meanwhile.
        """
        if not self.plausibility:
            return True
        return self.limits(family).min_mean_logprob is not None

    def limits(self, family: str) -> FamilyThresholds:
        """The limits that apply to ``family``: its own; the pooled floors (with its own
        length limit) while it has too few own completions; else none."""
        own = self.families.get(family, FamilyThresholds(None, None))
        pooled = self.pooled
        if pooled is None:
            return own
        if own.min_mean_logprob is None and pooled.min_mean_logprob is not None:
            own = dataclasses.replace(
                own, min_mean_logprob=pooled.min_mean_logprob, low_floors=pooled.low_floors
            )
        if own.min_rewarded_lead is None:
            own = dataclasses.replace(own, min_rewarded_lead=pooled.min_rewarded_lead)
        return own


class Calibration:
    """The node's own completions per family: mean token log-probs and rewarded lengths.

    Args:
        spec: the node's defence settings.
        max_new_tokens: the node's own completion cap.
    """

    def __init__(self, spec: DefenceSpec, max_new_tokens: int) -> None:
        self.spec = spec
        self._max_tokens = max_new_tokens + 1
        self._logprob: dict[str, deque[float]] = {}
        self._buckets = length_buckets(self._max_tokens)
        self._low: dict[str, dict[int, deque[float]]] = {}
        self._lengths: dict[str, deque[float]] = {}
        self._leads: dict[str, deque[float]] = {}
        self._seen: dict[str, int] = {}

    def observe(
        self,
        family: str,
        logprobs: Sequence[float],
        reward: float,
        text: str | None = None,
        finish_reason: str = "stop",
    ) -> None:
        """Record one own completion (its behaviour log-probs, EOS included, and its text
        and finish reason: what the brevity guard measures; every completion that answers
        or was cut counts, rewarded or not: the model's habit, known from the first rounds,
        when few are rewarded; :func:`~sapo_async.tasks.reward.own_lead`)."""
        if text is not None and self.spec.brevity_guard:
            self._seen[family] = self._seen.get(family, 0) + 1
            lead = own_lead(text, finish_reason)
            if lead is not None:
                leads = self._leads.setdefault(family, deque(maxlen=CALIBRATION_WINDOW))
                leads.append(float(lead))
        if not logprobs:
            return
        lp = self._logprob.setdefault(family, deque(maxlen=CALIBRATION_WINDOW))
        lp.append(sum(logprobs) / len(logprobs))
        lows = self._low.setdefault(family, {})
        for bucket in self._buckets:
            window = lows.setdefault(bucket, deque(maxlen=CALIBRATION_WINDOW))
            window.append(low_mean(logprobs[:bucket], PLAUSIBILITY_LOW_TOKENS))
        if reward > 0:
            lengths = self._lengths.setdefault(family, deque(maxlen=CALIBRATION_WINDOW))
            lengths.append(float(len(logprobs)))

    def thresholds(self) -> Thresholds:
        """The limits now, frozen (families with too few own completions get None)."""
        spec, need = self.spec, self.spec.calibration_min
        families: dict[str, FamilyThresholds] = {}
        for family in set(self._logprob) | set(self._lengths) | set(self._leads):
            lps = self._logprob.get(family, ())
            lows = self._low.get(family, {})
            lengths = self._lengths.get(family, ())
            leads = self._leads.get(family, ())
            families[family] = FamilyThresholds(
                self._floor(lps) if spec.plausibility and len(lps) >= need else None,
                _quantile(list(lengths), LENGTH_QUANTILE) * LENGTH_FACTOR
                if spec.length_guard and len(lengths) >= need
                else None,
                tuple((b, self._floor(lows[b])) for b in sorted(lows))
                if spec.plausibility and len(lps) >= need
                else (),
                self._lead_floor(leads, self._seen.get(family, 0)),
            )
        return Thresholds(
            families,
            self._max_tokens,
            spec.plausibility,
            spec.length_guard,
            PLAUSIBILITY_LOW_TOKENS,
            spec.repetition_limit,
            self._pooled() if spec.plausibility or spec.brevity_guard else None,
            spec.brevity_guard,
            spec.cut_after_answer,
        )

    def _pooled(self) -> FamilyThresholds | None:
        """The plausibility and brevity floors of every own completion, all families
        together (None, or a floor None, while there are fewer than ``calibration_min``)."""
        lps = [v for window in self._logprob.values() for v in window]
        lead = self._lead_floor(
            [v for window in self._leads.values() for v in window], sum(self._seen.values())
        )
        if len(lps) < self.spec.calibration_min or not self.spec.plausibility:
            return None if lead is None else FamilyThresholds(None, None, (), lead)
        lows = {
            b: [v for per_family in self._low.values() for v in per_family.get(b, ())]
            for b in self._buckets
        }
        return FamilyThresholds(
            self._floor(lps),
            None,
            tuple((b, self._floor(lows[b])) for b in sorted(lows) if lows[b]),
            lead,
        )

    def _lead_floor(self, leads: Sequence[float], seen: int) -> float | None:
        """The brevity floor over ``leads`` of ``seen`` own completions (None: guard off,
        too few seen, or too few of them show a lead: :data:`BREVITY_MIN_LEADS`)."""
        spec = self.spec
        need = min(BREVITY_MIN_LEADS, spec.calibration_min)
        if not spec.brevity_guard or seen < spec.calibration_min or len(leads) < need:
            return None
        return _quantile(list(leads), BREVITY_QUANTILE) / BREVITY_FACTOR

    def _floor(self, values: Sequence[float]) -> float:
        return _quantile(list(values), PLAUSIBILITY_QUANTILE) - PLAUSIBILITY_MARGIN


@dataclass(frozen=True, slots=True)
class CompletionView:
    """What :func:`screen` needs of one external completion, under the node's own model.

    Attributes:
        logprobs: per-token log-probs of the re-tokenised completion (EOS included; empty
            when no check that reads them is on).
        reward: the node's own verifier's reward.
        token_ids: the re-tokenised completion (what the repetition check reads).
        text: its text (what the brevity guard reads; None: not given, not read).
        stopped: it ends as the trainer will train it, with a stop token (sent with one,
            or cut after its answer); False for one that ran to its producer's cap
            without stopping (``finish_reason = "length"``, nothing for the cut to cut).
        p_value: the per-token test's p-value (:mod:`.token_test`) for a peer of the
            node's model; None for another model's (the calibrated floors judge it).
    """

    logprobs: Sequence[float]
    reward: float
    token_ids: Sequence[int] = ()
    text: str | None = None
    stopped: bool = True
    p_value: float | None = None


def screen(
    family: str, completions: Sequence[CompletionView], limits: Thresholds
) -> RejectReason | None:
    """The reason to drop an external group, or None to keep it.

    Args:
        family: the group's task family (whose thresholds apply).
        completions: the completions GRPO would push up (reward above the group's lowest).
        limits: the thresholds (the caller has already refused any completion over
            ``limits.max_tokens``: ``completion_too_many_tokens``).

    A group goes whole: one implausible or needlessly long completion condemns it (GRPO
    would push the payload up with that completion's advantage). Completions at the
    group's lowest reward are pushed down, not up, and are not screened: an honest group's
    unlikely wrong answers would otherwise be false positives.

    The length guard also refuses a rewarded completion that never stopped: truncated at
    its producer's cap, it is not an answer the policy finished, and pushing it up teaches
    writing to the cap (DAPO, arXiv 2503.14476, masks truncated samples for this reason;
    live networks saw stop tokens suppressed so every rollout ran to the cap: the
    ``capped`` attack).
    """
    family_limits = limits.limits(family)
    for c in completions:
        if limits.repetition_limit and repeated_span(c.token_ids) >= limits.repetition_limit:
            return RejectReason.REPETITIVE
        if limits.length_guard and c.reward > 0 and not c.stopped:
            return RejectReason.TOO_LONG
        tokens = len(c.logprobs)
        if (
            limits.length_guard
            and c.reward > 0
            and family_limits.max_rewarded_tokens is not None
            and tokens > family_limits.max_rewarded_tokens
        ):
            return RejectReason.TOO_LONG
        if (
            limits.brevity_guard
            and c.reward > 0
            and family_limits.min_rewarded_lead is not None
            and c.text is not None
            and answer_lead(c.text) < family_limits.min_rewarded_lead
        ):
            return RejectReason.TOO_BRIEF
        if limits.plausibility and tokens and _implausible(c, family_limits, limits):
            return RejectReason.IMPLAUSIBLE
    return None


def _implausible(c: CompletionView, family: FamilyThresholds, limits: Thresholds) -> bool:
    if c.p_value is not None:  # a peer of this model: the per-token test, no floors
        return c.p_value < TOKEN_TEST_LEVEL
    logprobs = c.logprobs
    floor = family.min_mean_logprob
    if floor is not None and sum(logprobs) / len(logprobs) < floor:
        return True
    low = family.low_floor(len(logprobs))
    return low is not None and low_mean(logprobs, limits.low_tokens) < low
