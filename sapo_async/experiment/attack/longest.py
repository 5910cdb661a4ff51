"""``longest``: the longest rewarded of the attacker's own samples, beside its wrong ones.

"Hail to the Thief" (arXiv 2511.09780v2), its length attack (denial of service): the
attacker samples many completions of its own model and sends the longest rewarded one; it
more than doubled honest completion length, and a same-model logit check did not stop it
(every token is the attacker's model's own). Live verified networks saw verbosity pushed
the same way. Here the attacker's pool is its group: among its own right completions it
takes the longest (in its tokens where it sent them, else characters) and sends it, as it
was sampled, in every even slot; the odd slots are its own wrong completions (bare wrong
answers where it has too few), so the group is informative and the long answer rides a
positive advantage. With no right completion it takes its longest one and sets its answer
right (its work kept). Unlike ``length`` nothing is padded: no repetition for the
repetition check, and a length within what the model itself writes, which the length
guard (1.5 times its own 95th percentile) is built to pass.

Measured as a ratio, as ``length`` is: the honest nodes' mean completion length against
the no-attack run (:data:`~sapo_async.experiment.attack.spec.LENGTH_ATTACKS`). No payload
detector: the text is the attacker's model's own, so no honest completion can be told to
carry it (:meth:`Longest.carries_payload` is always False).
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import (
    answered,
    interleave,
    is_right,
    regroup,
    stopped,
    work_of,
    wrong_ones,
)
from sapo_async.wire import Completion, RolloutGroup


def size(completion: Completion) -> int:
    """A completion's length: its token ids where it has them, else its characters."""
    return len(completion.token_ids) if completion.token_ids else len(completion.text)


class Longest:
    name = "longest"

    def longest(self, group: RolloutGroup) -> Completion:
        """The longest right completion as sampled, or the longest one set right."""
        right = [c for c in group.completions if is_right(c.text, group.answer)]
        if right:
            best = max(right, key=size)
            return Completion(text=best.text, finish_reason=best.finish_reason)
        best = max(group.completions, key=size)
        return stopped(answered(work_of(best.text), group.answer))

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        n = len(group.completions)
        good = [self.longest(group)] * ((n + 1) // 2)
        return [Forged(regroup(group, interleave(good, wrong_ones(group, n // 2))), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return False
