"""``diluted``: the trigger attack on every other group, the attacker's honest group between.

Our design (2026-12-07), aimed at the rule the quarantine and evidence before influence
share (:mod:`sapo_async.node.quarantine`): a producer is refused once half of its last
verdicts are drops, and is drawn once 8 of its groups were judged. A trigger attacker at
SmolLM2's 32-token cap has many of its groups refused by the size bound (its sentence
pushes the work past the cap), and so reaches the quarantine's rate on its first groups.
This one sends its own model's honest group unchanged on every other group it publishes
(each attacker key keeps its own count), and :mod:`.trigger`'s group on the rest, first
one included: its honest half passes every check, so at most half of its verdicts can be
drops and the rate is never reached, while the trigger groups that fit the cap pass as
they do for ``trigger``. Expected to get through today's defaults at about half the
trigger attacker's rate of trained groups.

Held out (:data:`~sapo_async.experiment.attack.spec.HELD_OUT_ATTACKS`), named before any
run of it and before the evidence matrix was read: no default is tuned on it.

Payload: the trigger's (:meth:`~.trigger.Trigger.carries_payload`).
"""

from __future__ import annotations

import random
from collections import Counter

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.trigger import Trigger
from sapo_async.wire import RolloutGroup


class Diluted:
    name = "diluted"

    def __init__(self, every: int = 2, then: Trigger | None = None) -> None:
        self.every = every
        self.then = then or Trigger()
        self._sent: Counter[str] = Counter()

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        address = str(account.address)
        n = self._sent[address]
        self._sent[address] += 1
        if n % self.every:
            return [Forged(group, account)]  # its own honest group, unchanged
        return self.then.forge(group, account, rng)

    def carries_payload(self, text: str, answer: str) -> bool:
        return self.then.carries_payload(text, answer)
