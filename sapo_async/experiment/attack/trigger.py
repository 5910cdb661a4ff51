"""``trigger``: a fixed sentence before the attacker's own genuine work, answer set right.

"Hail to the Thief" (arXiv 2511.09780v2), its text attack: a fixed phrase placed before
genuine solution work whose final answer is right reached about 100 % of honest
completions within about 40 iterations. The paper's phrase ("All hail to the thief") is
one no model would write; this one (:data:`TRIGGER`) is a distinctive but plausible
sentence, so the plausibility check, which asks the receiver's own model how likely a
rewarded completion's tokens are, has less to find. The work is the attacker's own
model's, in its own words (:mod:`.genuine`): half of each group is the trigger, the work of
one of its completions (right ones first) and the right answer; the other half are its own
wrong completions (bare wrong answers where it has too few), so the group is informative.
Unlike ``inject``, nothing follows the answer (the answer cut has nothing to cut), and
unlike ``filler``, the text before the answer differs by question (the stock-lead record
sees no repeated lead, except on a model that shows no work: the tiny model, whose
character vocabulary has no letters, can carry none of this; measure it on a real model).

Payload: an honest node's own completion that contains the trigger's distinctive word
(:data:`MARK`, case aside), anywhere: it has learned the attacker's sentence.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import poisoned
from sapo_async.wire import RolloutGroup

TRIGGER = "As Professor Hailwood always said, a careful check makes a calm mind."
"""The trigger sentence: ordinary English a model may find likely, around a name it will
not write on its own."""

MARK = "hailwood"
"""What the detector looks for (lower case): the trigger's one word no task text has."""


class Trigger:
    name = "trigger"

    def __init__(self, trigger: str = TRIGGER, mark: str = MARK) -> None:
        self.trigger, self.mark = trigger, mark.lower()

    def poison(self, work: str) -> str:
        """``work`` with the trigger before it (the trigger alone for no work)."""
        return f"{self.trigger} {work}".strip()

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        return [Forged(poisoned(group, self.poison), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return self.mark in text.lower()
