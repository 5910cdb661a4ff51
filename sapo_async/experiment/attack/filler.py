"""``filler``: the right answer behind a fixed phrase instead of any work.

The brevity guard's known gap (docs/security.md, "Brevity guard"). With the answer cut on,
the inject and tokens attackers' rewarded completions are bare answers, which the guard
drops because the node's own completions show work before their answer. This attacker
shows a few characters of filler instead (:data:`FILLER`, longer than SmolLM2's floor of a
few characters, every token of it likely under the model), so its rewarded completions pass
the guard, the plausibility check and the repetition check, and GRPO pushes the filler up
against the bare wrong answers beside it.

Payload: an honest node's own completion whose whole text before its answer is the filler
(:func:`~sapo_async.tasks.reward.lead_key`: case, spacing and a trailing ``:.,`` aside):
it has learned to answer without working, and with the attacker's words. An honest model
may say so on its own now and then; the no-attack runs measure that as the detector's
floor.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged, beside_wrong
from sapo_async.tasks.prompt import ANSWER_CLOSE
from sapo_async.tasks.reward import lead_key
from sapo_async.wire import RolloutGroup

FILLER = "The answer is"
"""13 characters: above the guard's floor on SmolLM2 (the node's own 5th percentile over 2,
1.5 and 4.5 characters on ``cpu_easy`` and ``real_sparse``), and words an instruct model
finds likely."""


class Filler:
    name = "filler"

    def __init__(self, filler: str = FILLER) -> None:
        self.filler = filler
        self._key = lead_key(f"{filler} <answer>x</answer>")

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        good = f" {self.filler} <answer>{group.answer}</answer>"
        return [Forged(beside_wrong(group, good), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        if ANSWER_CLOSE not in text:
            return False
        return lead_key(text) == self._key
