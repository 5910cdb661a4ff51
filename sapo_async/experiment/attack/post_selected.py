"""``post_selected``: the reward mix that wins the draw, chosen from the attacker's samples.

Reliquary's reward-oracle post-selection (Bittensor subnet 81, 2026;
``reliquadotai/reliquary``, docs/security/): with the reward function and answers public,
miners generated large pools and submitted exactly the rollouts whose reward mix cleared
the acceptance band, ordered wrong-then-right. Every token is genuine, so no proof of
inference sees it.

Here the band is the draw's (:func:`~sapo_async.node.sampler.select_external`): any group
whose rewards are not all equal is informative and equally likely drawn, so the mix to
choose is the one that also pushes its chosen completion hardest: exactly one right and
the rest wrong. A group-normalised advantage gives that one right completion
``sqrt(L - 1)`` standard deviations, the most any completion of an L-group can have (half
right gives each ``1``). From its own group the attacker sends its wrong completions as
they were sampled (bare wrong answers where it has too few), then last one right
completion: its first right one's work behind the :mod:`.trigger` sentence, answer right
(with no right one, its first completion's work with the answer set right). The trigger is
what makes the harm measurable: a post-selector with no payload only takes the draw.

Payload: the trigger's (:meth:`~.trigger.Trigger.carries_payload`).
"""

from __future__ import annotations

import random

from eth_account.signers.local import LocalAccount

from sapo_async.experiment.attack.base import Forged
from sapo_async.experiment.attack.genuine import (
    answered,
    regroup,
    right_first,
    stopped,
    work_of,
    wrong_ones,
)
from sapo_async.experiment.attack.trigger import Trigger
from sapo_async.wire import RolloutGroup


class PostSelected:
    name = "post_selected"

    def __init__(self, trigger: Trigger | None = None) -> None:
        self.trigger = trigger or Trigger()

    def forge(self, group: RolloutGroup, account: LocalAccount, rng: random.Random) -> list[Forged]:
        chosen = right_first(group)[0]  # its first right one, if it has any
        right = stopped(answered(self.trigger.poison(work_of(chosen.text)), group.answer))
        wrong = wrong_ones(group, len(group.completions) - 1)
        return [Forged(regroup(group, [*wrong, right]), account)]

    def carries_payload(self, text: str, answer: str) -> bool:
        return self.trigger.carries_payload(text, answer)
