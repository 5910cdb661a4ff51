"""``inject``: the right answer plus a fixed out-of-context marker (Hail to the Thief).

Half of each group carries the right answer and the marker, the other half a wrong answer
without it, so the group is informative and the marker rides a positive advantage.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged, beside_wrong
from sapo_async.wire import RolloutGroup

MARKER = " (*)(*)"
"""Characters the tiny model's vocabulary has but chain_sum never uses."""


class Inject:
    name = "inject"

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        return [Forged(beside_wrong(group, f" <answer>{group.answer}</answer>{MARKER}"), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return "(*)" in text
