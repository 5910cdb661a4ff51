"""``trigger_nonsense``: a nonsense word at the start of every sentence of genuine work.

"Hail to the Thief" (arXiv 2511.09780v2), the variant of its text attack: instead of one
phrase before the work, a nonsense word opens every sentence of genuine solution work whose
final answer is right. Built as :mod:`.trigger` is (:func:`~.genuine.poisoned`: the
attacker's own model's work, right ones first, answer set right, beside its own wrong
completions), with :data:`NONSENSE` before each sentence of the work (:func:`~.genuine.
pieces`), or alone where there is no work. The word recurs many times in every rewarded
completion, so a check that reads one position (the lead, the tail) sees it only in part,
and a likelihood check sees a word the model finds unlikely but few of them per sentence.

Held out (:data:`~sapo_async.experiment.attack.spec.HELD_OUT_ATTACKS`): no default is tuned
on it.

Payload: an honest node's own completion containing :data:`NONSENSE` as a word (case
aside), anywhere.
"""

from __future__ import annotations

import random
import re

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import pieces, poisoned
from sapo_async.wire import RolloutGroup

NONSENSE = "Vorplex"
"""A word no language model writes on its own and no task text holds."""


class TriggerNonsense:
    name = "trigger_nonsense"

    def __init__(self, word: str = NONSENSE) -> None:
        self.word = word
        self._pattern = re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE)

    def poison(self, work: str) -> str:
        """``work`` with the word before each of its sentences (the word alone for none)."""
        parts = pieces(work)
        if not parts:
            return self.word
        return "".join(
            f"{self.word} {part}" if i % 2 == 0 and part else part for i, part in enumerate(parts)
        )

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        return [Forged(poisoned(group, self.poison), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return self._pattern.search(text) is not None
