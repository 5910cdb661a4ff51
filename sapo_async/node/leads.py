"""Which peers show the same words before every right answer: the brevity guard's gap.

The brevity guard (:mod:`sapo_async.node.defence`) drops a rewarded peer answer that shows
far less text before its ``<answer>`` than the node's own do; SmolLM2's own leads are
often a few characters, so its floor is low (1.5 to 4.5 characters on ``cpu_easy``), and
a right answer behind a few characters of stock filler (``The answer is``, the ``filler``
attack) passes it. On SmolLM2 that attacker's groups were trained and the filler spread to
the honest nodes' own completions (docs/security.md).

Work depends on the question; filler does not. This record keeps, per producer, the
normalised lead (:func:`~sapo_async.tasks.reward.lead_key`) of each completion it was
rewarded for (reward above its group's floor, what GRPO pushes up) in its last
:data:`WINDOW_GROUPS` groups with any this node scored, and the question each answered.
Once one lead is at least ``stock_lead_share`` of those answers (at least
:data:`MIN_ANSWERS`) on at least :data:`MIN_QUESTIONS` different questions, that lead is
the producer's *stock lead*: its completions showing it are left out of training (their
group is judged by the rest; a group left with no spread is dropped as uninformative), as
the tail record (:mod:`.tails`) does for text after the answer. An empty lead never counts
(the brevity guard's case). Nothing is refused or quarantined for it.

*Probation* (``stock_lead_probation``): on SmolLM2 the record alone came too late: each
honest node trained a few of each attacker's groups before the share could be read, and a
dozen such groups seeded the filler, which the nodes' own rollouts then carried. With
probation every buffered group is scored for the record once, before the round's draw
(the verifier only, no forward pass), and a producer whose rewarded answers to two
different questions show the same words before them waits, its groups left in the buffer,
until the share can be read (:meth:`LeadRecord.judged`: :data:`MIN_ANSWERS` answers on
:data:`MIN_QUESTIONS` questions). A producer that has shown no repeated words is not held:
its work differs by question, the others' checks judge it. Probation used to hold every
producer until it was judged, which at SmolLM2's reward rate took an honest peer several
rounds (answers on three questions): with no attack, the 1/1 swarm's honest nodes trained
47 external groups with the defences on against 78 off (issue 57; CHANGELOG.md).
A filler attacker shows its filler on the two questions of its first round, so it waits
from its first group as before.

*Cannot* stop: an attacker that varies its filler (then each phrase is under the share,
and the plausibility check must judge the words), or puts a stock lead on fewer than
``stock_lead_share`` of its right answers; with probation, one that shows honest work
until it is judged and the filler after (its filler is trained until it is the share of
the window again), and one that sends its filler on one question only, once (its first
group is trained before a second question shows the words again).

Threads: as the tail record, one :class:`LeadRecord` on the event loop; the selection
thread gets a :meth:`~LeadRecord.copy` and returns what it observed; the loop records it
(:meth:`~LeadRecord.observe`), each group once, by hash.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from sapo_async.node.windows import ProducerWindows

__all__ = [
    "MIN_ANSWERS",
    "MIN_QUESTIONS",
    "TRIED_GROUPS",
    "WINDOW_GROUPS",
    "LeadObservation",
    "LeadRecord",
]

WINDOW_GROUPS = 16
"""Groups per producer the share is read over (the newest ones this node scored)."""

MIN_ANSWERS = 8
"""Rewarded completions a producer must have in the window before its share counts."""

MIN_QUESTIONS = 3
"""Different questions a lead must precede a rewarded answer on to be a stock lead: an
honest model that words its work the same on one question twice is not showing filler."""


TRIED_GROUPS = 4096
"""Scored groups remembered by hash, so probation scores a held group once, not every
round it waits (a peer that is never judged, or floods, costs one score per group)."""


@dataclass(frozen=True, slots=True)
class LeadObservation:
    """One scored peer group: its question and the leads of its rewarded completions
    (none: nothing rewarded; the group is only remembered as scored)."""

    rollout_hash: bytes
    producer: str
    question: str
    leads: tuple[str, ...]


class LeadRecord:
    """Per producer, the rewarded leads of its last :data:`WINDOW_GROUPS` scored groups."""

    def __init__(
        self,
        share: float,
        *,
        window: int = WINDOW_GROUPS,
        least: int = MIN_ANSWERS,
        questions: int = MIN_QUESTIONS,
        probation: bool = False,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"stock_lead_share {share!r} is not allowed: in (0, 1]")
        self.share = share
        self.probation = probation
        self._least = least
        self._questions = questions
        self._groups: ProducerWindows[tuple[str, tuple[str, ...]]] = ProducerWindows(window)
        self._tried: OrderedDict[bytes, None] = OrderedDict()

    def copy(self) -> LeadRecord:
        """An independent copy (what the selection thread may change)."""
        out = LeadRecord(
            self.share, least=self._least, questions=self._questions, probation=self.probation
        )
        out._groups = self._groups.copy()
        out._tried = OrderedDict(self._tried)
        return out

    def add(self, seen: LeadObservation) -> None:
        """Record one group (again: no change; the newest ``window`` with a rewarded
        answer are kept, so groups of no spread cannot dilute a producer's share)."""
        self._tried[seen.rollout_hash] = None
        while len(self._tried) > TRIED_GROUPS:
            self._tried.popitem(last=False)
        if seen.leads:
            self._groups.add(seen.producer, seen.rollout_hash, (seen.question, seen.leads))

    def tried(self, rollout_hash: bytes) -> bool:
        """Whether the group was scored already (one of the last :data:`TRIED_GROUPS`)."""
        return rollout_hash in self._tried

    def judged(self, producer: str) -> bool:
        """Whether the record can judge ``producer``: it has shown no non-empty lead before
        rewarded answers on two different questions (nothing to judge: work differs by
        question), or it has and the share can be read (at least :data:`MIN_ANSWERS`
        rewarded answers on at least :data:`MIN_QUESTIONS` questions)."""
        groups = self._groups.values(producer)
        asked: dict[str, set[str]] = {}
        for question, leads in groups:
            for lead in filter(None, leads):
                asked.setdefault(lead, set()).add(question)
        if all(len(questions) < 2 for questions in asked.values()):
            return True
        answers = sum(len(leads) for _, leads in groups)
        return len({q for q, _ in groups}) >= self._questions and answers >= self._least

    def unproven(self, producer: str) -> bool:
        """Whether ``producer``'s groups wait for a verdict (probation on, and the same
        words before its answers to two questions, too few answers yet to read the share)."""
        return self.probation and not self.judged(producer)

    def stock(self, producer: str) -> str | None:
        """``producer``'s stock lead (None: it has none): a non-empty lead before at least
        ``share`` of its at least :data:`MIN_ANSWERS` recent rewarded answers, on at least
        :data:`MIN_QUESTIONS` questions."""
        groups = self._groups.values(producer)
        answers = sum(len(leads) for _, leads in groups)
        if answers < self._least:
            return None
        counts = Counter(lead for _, leads in groups for lead in leads if lead)
        for lead, n in counts.most_common():
            if n < self.share * answers:
                return None
            asked = {q for q, leads in groups if lead in leads}
            if len(asked) >= self._questions:
                return lead
        return None

    def observe(self, seen: Iterable[LeadObservation]) -> list[str]:
        """Record a round's observations; return the producers that got a stock lead."""
        seen = list(seen)
        before = {s.producer: self.stock(s.producer) for s in seen}
        for s in seen:
            self.add(s)
        return sorted(p for p, was in before.items() if was is None and self.stock(p))
