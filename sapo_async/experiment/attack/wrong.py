"""``wrong``: well-formed wrong answers (a control: the receiver's own verifier stops it)."""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged, retext, wrong_answer
from sapo_async.tasks import extract_answer
from sapo_async.wire import RolloutGroup


class Wrong:
    name = "wrong"

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        texts = [f" <answer>{wrong_answer(group.answer)}</answer>"] * len(group.completions)
        return [Forged(retext(group, texts), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return extract_answer(text) == wrong_answer(answer)
