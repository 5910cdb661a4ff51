"""A node's reward on held-out questions after its run: the attack experiment's and the
async paper table's one evaluation.

A node's training reward is measured on the questions it trains on; after its last round
it also answers ``questions`` held-out questions x ``completions`` answers
(:meth:`~sapo_async.node.learner.Learner.evaluate`: the task source's ``eval`` draws, of
the families it trained on and never drawn for a round; the same questions and sampling
seed for every node and run of a swarm seed), scored by its own verifier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sapo_async.node.learner import Learner

__all__ = ["EVAL_SEED", "held_out_reward"]

EVAL_SEED = 1_000_003
"""The held-out evaluation's sampling seed: the same for every node and run (common random
numbers), far from any round's."""


async def held_out_reward(learner: Learner, questions: int, completions: int) -> float:
    """``learner``'s mean reward over ``questions`` held-out questions x ``completions``.

    Raises:
        ConfigError: questions or completions below 1.
        GenerationError: the generator failed.
    """
    scored = await learner.evaluate(questions, completions, seed=EVAL_SEED)
    rewards = [float(c.reward) for g in scored for c in g.completions]
    return sum(rewards) / max(len(rewards), 1)
