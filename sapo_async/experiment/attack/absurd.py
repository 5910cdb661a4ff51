"""``absurd``: task references far outside any sane preset, and crafted answer text.

For each group the attacker generates it sends two: the same question slot re-derived under
a chain_sum config of ``terms`` terms (a valid but huge question, a config no preset
holds, a new one each time so no cache helps), and a group whose completions are
``tags`` unclosed ``<answer>`` tags (the input that made the old answer extraction
quadratic), half of them right, so both groups are informative and reach training when
nothing stops them. Measured as the honest round time against the no-attack run.
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount
from msgspec.structs import replace

from sapo_async.experiment.attack.base import Forged, retext, wrong_answer
from sapo_async.tasks import derive
from sapo_async.tasks.spec import canonical_config_json, config_digest
from sapo_async.wire import RolloutGroup, TaskRef


class Absurd:
    name = "absurd"

    def __init__(self, terms: int = 150, tags: int = 400) -> None:
        self.terms, self.tags = terms, tags

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        n = len(group.completions)
        terms = self.terms + rng.randrange(50)
        config = canonical_config_json(
            {"min_terms": terms, "max_terms": terms, "min_digits": 1, "max_digits": 2}
        )
        ref = TaskRef(
            family=group.task.family,
            config_digest=config_digest(config),
            seed=group.task.seed,
            index=group.task.index,
        )
        item = derive(ref, config)
        right = f" <answer>{item.answer}</answer>"
        wrong = f" <answer>{wrong_answer(item.answer)}</answer>"
        huge = retext(
            replace(
                group, task=ref, task_config=config, question=item.question, answer=item.answer
            ),
            [right if i % 2 == 0 else wrong for i in range(n)],
        )
        crafted_text = " " + "<answer>" * self.tags
        good = f" <answer>{group.answer}</answer>"
        crafted = retext(group, [good if i % 2 == 0 else crafted_text for i in range(n)])
        return [Forged(huge, account), Forged(crafted, account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return False
