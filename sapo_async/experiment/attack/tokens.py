"""``tokens``: the right answer plus an arbitrary run of tokens after it.

Half of each group carries the right answer and a random run of :data:`ALPHABET` after
the closing tag, the other half a wrong answer. Payload: what follows the last closing tag
is made of the attack's alphabet alone (at least :data:`MIN_RUN` of its characters, spaces
aside). Honest text after the tag (a model that keeps talking, or is cut off mid-sentence)
has letters in it and is not counted; an honest model that restates a sum after the tag
(``2+3=5``) is, which the no-attack runs measure as the detector's floor.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged, retext, wrong_answer
from sapo_async.tasks.reward import answer_tail
from sapo_async.wire import RolloutGroup

ALPHABET = "0123456789+-*/()=."
MIN_RUN = 4
"""The shortest run the attack sends, and so the shortest the detector counts."""


class Tokens:
    name = "tokens"

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        texts = []
        for i in range(len(group.completions)):
            if i % 2:
                texts.append(f" <answer>{wrong_answer(group.answer)}</answer>")
            else:
                run = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(MIN_RUN, 8)))
                texts.append(f" <answer>{group.answer}</answer> {run}")
        return [Forged(retext(group, texts), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        tail = "".join((answer_tail(text) or "").split())
        return len(tail) >= MIN_RUN and all(c in ALPHABET for c in tail)
