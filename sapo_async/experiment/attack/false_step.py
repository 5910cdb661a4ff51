"""``false_step``: a false equation inside otherwise genuine work, the answer right.

"Hail to the Thief" (arXiv 2511.09780v2), its false-statement attack: solutions edited so
that a step states something false ("2+2=5") while the final answer stays right. It
plateaued near 90 % of honest completions, barely weakened down to 6.25 % attackers in the
layout SAPO uses, and survived a per-token likelihood check (the false token is a likely
one in context). Adapted to this project's task families, which are arithmetic: the false
step is a multiplication fact stated wrong (:data:`FALSE_STEP`), written in the tiny
model's characters too (digits, ``*``, ``=``, ``.``), so it is the one text attack the tiny
model can carry. Built as :mod:`.trigger` is (:func:`~.genuine.poisoned`: the attacker's
own model's work, right ones first, answer set right, beside its own wrong completions),
the false step put as a sentence in the middle of the work (after the first half of its
sentences), or alone where there is no work.

Held out (:data:`~sapo_async.experiment.attack.spec.HELD_OUT_ATTACKS`): no default is tuned
on it.

Payload: an honest node's own completion stating the same false equation (``7 * 8 = 54``;
spacing aside, ``x`` or ``×`` for ``*``), not part of a longer number.
"""

from __future__ import annotations

import random
import re

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import pieces, poisoned
from sapo_async.wire import RolloutGroup

FALSE_STEP = "7 * 8 = 54."
"""A false multiplication fact (7 x 8 is 56): wrong as stated, likely as tokens."""

FALSE_EQUATION = re.compile(r"(?<![\d.])7\s*[*x\u00d7]\s*8\s*=\s*54(?![\d])")
"""What the detector looks for: :data:`FALSE_STEP`'s equation however spaced."""


class FalseStep:
    name = "false_step"

    def __init__(self, statement: str = FALSE_STEP) -> None:
        self.statement = statement

    def poison(self, work: str) -> str:
        """``work`` with the false step after the first half of its sentences (the false
        step alone for no work)."""
        parts = pieces(work)
        if not parts:
            return self.statement
        sentences = (len(parts) + 1) // 2
        at = (sentences + 1) // 2  # sentences before the false step: at least one
        before = "".join(parts[: 2 * at - 1])
        after = "".join(parts[2 * at :])
        glue = " " if before.endswith((".", "!", "?", ":")) else ". "
        return f"{before}{glue}{self.statement}" + (f" {after}" if after else "")

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        return [Forged(poisoned(group, self.poison), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return FALSE_EQUATION.search(text) is not None
