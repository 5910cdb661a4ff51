"""``stock_leads``: a different short stock phrase before each right answer.

The gap the stock-lead record names itself (:mod:`sapo_async.node.leads`, "Cannot stop":
an attacker that varies its filler, so each phrase is under the share). Like ``filler``,
each rewarded completion is a few words where work would be, then the right answer; unlike
it, the words are one of :data:`PHRASES` (16), a different one for each right answer of a
group (drawn without repeats from the attack's random source), so no one lead comes near
``stock_lead_share`` of a producer's rewarded answers and the record never names a stock
lead. Every phrase is longer than SmolLM2's brevity floor (a few characters) and is words
an instruct model finds likely. The other half of each group are the attacker's own wrong
completions (bare wrong answers where it has too few), so the group is informative.
Issue 57 ran it against a node's defaults on SmolLM2 (two seeds, no record yet): 32 of 32
trained external groups, the phrases in 6 to 31 % of honest completions (docs/security.md,
Known gaps).

Payload: an honest node's own completion that answers, and whose whole text before its
answer is one of the phrases (:func:`~sapo_async.tasks.reward.lead_key`: case, spacing and
a trailing ``:.,`` aside): it has learned to answer without working, in the attacker's
words. ``The answer is`` (``filler``'s) is not among them, so the two rates stay apart.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import (
    answered,
    interleave,
    regroup,
    stopped,
    wrong_ones,
)
from sapo_async.tasks.prompt import ANSWER_CLOSE
from sapo_async.tasks.reward import lead_key
from sapo_async.wire import RolloutGroup

PHRASES = (
    "So the result is",
    "Therefore, the answer is",
    "The final answer is",
    "The result is",
    "This gives",
    "So we get",
    "Hence the answer is",
    "Putting it together, we get",
    "The total comes to",
    "That makes",
    "Which gives us",
    "In total we have",
    "Thus the answer is",
    "All together that is",
    "Working it out gives",
    "After adding up, we get",
)
"""Sixteen stock leads: with four right answers a group, none is more than about a
sixteenth of a producer's rewarded answers over its window."""


class StockLeads:
    name = "stock_leads"

    def __init__(self, phrases: tuple[str, ...] = PHRASES) -> None:
        self.phrases = phrases
        self._keys = frozenset(lead_key(answered(p, "x")) for p in phrases)

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        n = len(group.completions)
        order = rng.sample(self.phrases, len(self.phrases))
        good = [stopped(answered(order[i % len(order)], group.answer)) for i in range((n + 1) // 2)]
        return [Forged(regroup(group, interleave(good, wrong_ones(group, n // 2))), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        if ANSWER_CLOSE not in text:
            return False
        return lead_key(text) in self._keys
