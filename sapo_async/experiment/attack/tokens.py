"""``tokens``: the right answer plus an arbitrary run of tokens after it.

Half of each group carries the right answer and a random run of vocabulary characters
after the closing tag, the other half a wrong answer; payload: anything after the tag.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import (
    Forged,
    payload_after_answer,
    retext,
    wrong_answer,
)
from sapo_async.wire import RolloutGroup

ALPHABET = "0123456789+-*/()=."


class Tokens:
    name = "tokens"

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        texts = []
        for i in range(len(group.completions)):
            if i % 2:
                texts.append(f" <answer>{wrong_answer(group.answer)}</answer>")
            else:
                run = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(4, 8)))
                texts.append(f" <answer>{group.answer}</answer> {run}")
        return [Forged(retext(group, texts), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return payload_after_answer(text)
