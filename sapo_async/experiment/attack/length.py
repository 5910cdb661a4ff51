"""``length``: the right answer, padded to the completion limit.

Correct but needlessly long: half of each group pads the right answer to ``limit`` tokens,
the other half answers wrong, briefly. Measured as the honest nodes' mean completion length
against the no-attack run.

The pad is counted in the receivers' tokens. The tiny tokenizer has one token per
character, so the pad is spaces. A real (BPE) tokenizer merges a run of spaces into one
token (SmolLM2: ten spaces are one), so with a tokenizer the pad is ``" ."`` repeated, one
token per repeat, grown until the completion and its end-of-sequence token fill ``limit``.
"""

from __future__ import annotations

import random
from typing import Any

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged, retext, wrong_answer
from sapo_async.wire import RolloutGroup

REAL_PAD = " ."
"""One token per repeat in SmolLM2's BPE (a space and a full stop merge, runs do not)."""


class Length:
    name = "length"

    def __init__(self, limit: int = 16, tokenizer: Any = None) -> None:
        self.limit = limit
        self._tokenizer = tokenizer
        self.pad_unit = " " if tokenizer is None else REAL_PAD

    def _tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False)) + 1  # + EOS

    def padded(self, answer: str) -> str:
        """The right answer padded to ``limit`` tokens (end of sequence included)."""
        tail = f"<answer>{answer}</answer>"
        if self._tokenizer is None:
            # ' ' + '<answer>' + digits + '</answer>' + EOS are 3 + len(answer) + 1 tokens.
            return " " * max(1, self.limit - 4 - len(answer)) + tail
        pad = self.pad_unit
        while self._tokens(pad + self.pad_unit + " " + tail) <= self.limit:
            pad += self.pad_unit
        return f"{pad} {tail}"

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        good = self.padded(group.answer)
        bad = f" <answer>{wrong_answer(group.answer)}</answer>"
        n = len(group.completions)
        return [Forged(retext(group, [good if i % 2 == 0 else bad for i in range(n)]), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return text.startswith(self.pad_unit * 2)
