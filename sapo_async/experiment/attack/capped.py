"""``capped``: rewarded completions run to the token cap with no stop token.

Reliquary's cap-path forcing (Bittensor subnet 81, 2026; ``reliquadotai/reliquary``,
docs/security/): miners suppressed the end-of-sequence token, so every rollout ran to the
token cap, a path the checks exempted (one miner had 438 of 440 rollouts at the cap).
Here the attacker's right completions (right ones first; a wrong one's work with its
answer set right where it has too few) are continued with more of its own text, its work
repeated (its answer's digits where it shows none), until the completion fills the cap
(``limit`` tokens of the receivers, the same ``max_new_tokens`` as every node's) and ends
with the right answer and no stop token: ``finish_reason = "length"``, as a sampler whose
stop token is suppressed would leave it. The answer comes last, so the answer cut has
nothing to cut, and a receiver trains every token of it with no stop token appended: what
it learns is to write to the cap. The other half of each group are the attacker's own wrong
completions (bare wrong answers where it has too few), so the group is informative.

Sized as :mod:`.length` is, in the receivers' tokens: with no tokenizer, the tiny model's
(one token per character, each answer tag one token); with one, its own count. Not past
the cap: a completion longer than ``max_new_tokens`` plus a stop token is refused by every
receiver's size bound (``completion_too_many_tokens``), a different and already measured
check.

Measured as a ratio, as ``length`` is: the honest nodes' mean completion length against
the no-attack run (:data:`~sapo_async.experiment.attack.spec.LENGTH_ATTACKS`); no payload
detector (:meth:`Capped.carries_payload` is always False).
"""

from __future__ import annotations

import random
from typing import Any

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import (
    answered,
    interleave,
    regroup,
    right_first,
    work_of,
    wrong_ones,
)
from sapo_async.tasks.prompt import ANSWER_CLOSE, ANSWER_OPEN
from sapo_async.wire import Completion, RolloutGroup


class Capped:
    name = "capped"

    def __init__(self, limit: int = 16, tokenizer: Any = None) -> None:
        self.limit = limit
        self._tokenizer = tokenizer

    def tokens(self, text: str) -> int:
        """``text``'s length in the receivers' tokens (no stop token: it has none)."""
        if self._tokenizer is None:
            tags = text.count(ANSWER_OPEN) * (len(ANSWER_OPEN) - 1)
            return len(text) - tags - text.count(ANSWER_CLOSE) * (len(ANSWER_CLOSE) - 1)
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def filled(self, work: str, answer: str) -> str:
        """``work`` and then more of it, the right answer last, the whole as many tokens as
        fit in ``limit`` (``work`` and the answer as they are where they fill it already)."""
        unit = f" {work or answer}"
        more = unit * (self.limit // max(self.tokens(unit), 1) + 2)

        def text(chars: int) -> str:  # unstripped at the end: one more character, one more token
            return answered((work + more[:chars]).lstrip(), answer)

        low, high = 0, len(more)  # the longest prefix of `more` that fits (binary search)
        while low < high:
            mid = (low + high + 1) // 2
            if self.tokens(text(mid)) <= self.limit:
                low = mid
            else:
                high = mid - 1
        return text(low)

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        n = len(group.completions)
        good = [
            Completion(text=self.filled(work_of(c.text), group.answer), finish_reason="length")
            for c in right_first(group)[: (n + 1) // 2]
        ]
        return [Forged(regroup(group, interleave(good, wrong_ones(group, n // 2))), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return False
