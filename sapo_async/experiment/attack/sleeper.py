"""``sleeper``: honest until the records have judged it, then the trigger attack.

Our own design, aimed at a gap today's defaults are expected to miss: every per-producer
judgement is made early and read from a window. Probation (``stock_lead_probation``,
:mod:`sapo_async.node.leads`) trains no group of a producer until the stock-lead record can
judge it (rewarded answers on :data:`~sapo_async.node.leads.MIN_QUESTIONS` questions, and
either :data:`~sapo_async.node.leads.MIN_ANSWERS` of them or no lead repeated across
questions), and the quarantine reads a producer's last verdicts. A sleeper sends its own
honest groups unchanged while it earns that judgement, then switches to :mod:`.trigger`
for good: by then the record can judge it by answer count, whatever its leads show
next, and its kept honest groups stand in the quarantine's verdicts.
docs/security.md names the case under probation's "Cannot stop".

When it wakes: at the first group of round ``rounds`` or later (``group.producer_round``,
the attacker's own round counter from 0) once its honest groups so far showed, by its own
reckoning (it knows the right answer), at least ``answers`` rewarded answers (right ones
in a group that also holds wrong ones: reward above the group's lowest) on at least
``questions`` questions, the record's own thresholds. ``rounds`` (:data:`SLEEP_ROUNDS`)
is a floor on top: at SmolLM2's reward rate about a third of honest groups are
informative, so at B = 2 questions a round three informative groups take four or five
rounds, and the floor keeps it honest for at least that long wherever the rate is higher.
Each attacker node (its own key) keeps its own count; once awake it stays awake.

Held out (:data:`~sapo_async.experiment.attack.spec.HELD_OUT_ATTACKS`): no default is tuned
on it.

Payload: the trigger's (:meth:`~.trigger.Trigger.carries_payload`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import is_right
from sapo_async.experiment.attack.trigger import Trigger
from sapo_async.node.leads import MIN_ANSWERS, MIN_QUESTIONS
from sapo_async.wire import RolloutGroup

SLEEP_ROUNDS = 4
"""Rounds a sleeper stays honest at the least (see the module docstring)."""


@dataclass(slots=True)
class Shown:
    """What one attacker's honest groups showed: rewarded answers, and their questions."""

    answers: int = 0
    questions: set[str] = field(default_factory=set)


class Sleeper:
    name = "sleeper"

    def __init__(
        self,
        rounds: int = SLEEP_ROUNDS,
        answers: int = MIN_ANSWERS,
        questions: int = MIN_QUESTIONS,
        then: Trigger | None = None,
    ) -> None:
        self.rounds, self.answers, self.questions = rounds, answers, questions
        self.then = then or Trigger()
        self._shown: dict[str, Shown] = {}
        self._awake: set[str] = set()

    def awake(self, address: str) -> bool:
        """Whether the attacker with ``address`` attacks now."""
        return address in self._awake

    def _judged(self, address: str) -> bool:
        shown = self._shown.get(address, Shown())
        return shown.answers >= self.answers and len(shown.questions) >= self.questions

    def _show(self, address: str, group: RolloutGroup) -> None:
        right = sum(is_right(c.text, group.answer) for c in group.completions)
        if 0 < right < len(group.completions):  # informative: its right answers rewarded
            shown = self._shown.setdefault(address, Shown())
            shown.answers += right
            shown.questions.add(group.question)

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        address = str(account.address)
        if group.producer_round >= self.rounds and self._judged(address):
            self._awake.add(address)
        if self.awake(address):
            return self.then.forge(group, account, rng)
        self._show(address, group)
        return [Forged(group, account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return self.then.carries_payload(text, answer)
