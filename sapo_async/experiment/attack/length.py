"""``length``: the right answer, padded with spaces to the completion limit.

Correct but needlessly long: half of each group pads the right answer to ``limit`` tokens
(the tiny tokenizer has one token per character), the other half answers wrong, briefly.
Measured as the honest nodes' mean completion length against the no-attack run.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged, retext, wrong_answer
from sapo_async.wire import RolloutGroup


class Length:
    name = "length"

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        # ' ' + '<answer>' + digits + '</answer>' + EOS are 3 + len(answer) + 1 tokens.
        pad = " " * max(1, self.limit - 4 - len(group.answer))
        good = f"{pad}<answer>{group.answer}</answer>"
        bad = f" <answer>{wrong_answer(group.answer)}</answer>"
        n = len(group.completions)
        return [Forged(retext(group, [good if i % 2 == 0 else bad for i in range(n)]), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return text.startswith("  ")
