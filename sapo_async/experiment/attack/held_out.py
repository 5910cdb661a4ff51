"""The attack summary's ``held_out`` section: honest reward measured after the run.

A run's honest reward in :mod:`.summary` is the sum of what the honest nodes earned on
their own training questions over the rounds. At the sizes a CPU runs (B = 2 questions
x L = 4 answers a round, rewards near 0.1) that sum rests on a few dozen right answers, so
one seed's ratio swings by a third either way and five seeds cannot place a mean of 0.8
against a goal of 0.9. With ``eval_questions`` set, every honest node also answers the
same held-out questions after its last round (:meth:`~sapo_async.node.learner.Learner.
evaluate`: ``eval_questions`` x ``eval_completions`` answers, the same sampling seed in
every run), and this section compares those rewards: what the attack left the honest
nodes able to do, on many more answers.

Per attack and seed: ``eval_reward_on`` (the honest nodes' mean under attack, defences
on), ``eval_reward_no_attack_on`` / ``_off`` (the same nodes in the no-attack runs),
``honest_eval_ratio_on_same`` (on over no attack with the defences on: what the attack
costs a defended node) and, where the undefended no-attack run was measured too,
``honest_eval_ratio_on`` (over it, as the goal's ratio in :mod:`.summary`), and where the
honest nodes' own swarm ran with the defences on, ``eval_reward_honest_only_on`` and
``honest_eval_ratio_on_honest_only_same`` (over it: the ratio the goal is read on, as in
:mod:`.defended`); their means over the seeds and each against the goal
(:func:`goal_over_seeds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure, honest_only_label
from sapo_async.experiment.report import goal_over_seeds, goal_text

__all__ = ["HONEST_REWARD_GOAL", "held_out", "held_out_lines"]

HONEST_REWARD_GOAL = 0.9
"""Issue 23's bound on honest reward with the defences on over no attack (at least)."""

RATIOS = (
    "honest_eval_ratio_on",
    "honest_eval_ratio_on_same",
    "honest_eval_ratio_on_honest_only_same",
)


def _nodes_reward(run: RunMeasure, nodes: Sequence[int]) -> float:
    """The mean held-out reward of ``nodes`` (indices into the swarm) in ``run``."""
    return sum(run.eval_rewards[i] for i in nodes) / len(nodes)


def held_out(spec: AttackSpec, runs: Sequence[RunMeasure]) -> dict[str, Any]:
    """The ``held_out`` section (see the module docstring); empty ``attacks`` when no run
    measured held-out reward. A seed counts for an attack when its defended attack run and
    the defended no-attack run measured it; the ratio over the undefended no-attack run is
    there where that run measured it too (``--defended-only`` matrices recorded before it
    ran that run lack it)."""
    ij = f"{spec.local}/{spec.external}"
    alone = honest_only_label(spec)
    key = {(r.attack, r.defences, r.seed, r.config): r for r in runs if r.eval_rewards}
    attacks: dict[str, Any] = {}
    for attack in spec.attacks:
        per_seed: dict[str, dict[str, float]] = {}
        for seed in spec.seeds:
            on = key.get((attack, True, seed, ij))
            base_off = key.get(("none", False, seed, ij))
            base_on = key.get(("none", True, seed, ij))
            if on is None or base_on is None:
                continue
            honest = on.honest
            reward = _nodes_reward(on, honest)
            on_reward = _nodes_reward(base_on, honest)
            per_seed[str(seed)] = {
                "eval_reward_on": reward,
                "eval_reward_no_attack_on": on_reward,
                "honest_eval_ratio_on_same": reward / max(on_reward, 1e-12),
            }
            if base_off is not None:
                off_reward = _nodes_reward(base_off, honest)
                per_seed[str(seed)] |= {
                    "eval_reward_no_attack_off": off_reward,
                    "honest_eval_ratio_on": reward / max(off_reward, 1e-12),
                }
            own = key.get(("none", True, seed, alone))
            # Recorded before the control evaluated every honest node: one node's, left out.
            if own is not None and len(own.eval_rewards) >= len(honest):
                own_reward = _nodes_reward(own, honest)
                per_seed[str(seed)] |= {
                    "eval_reward_honest_only_on": own_reward,
                    "honest_eval_ratio_on_honest_only_same": reward / max(own_reward, 1e-12),
                }
        if not per_seed:
            continue
        seeds = list(per_seed.values())
        rewards = (
            "eval_reward_on",
            "eval_reward_no_attack_on",
            "eval_reward_no_attack_off",
            "eval_reward_honest_only_on",
        )
        metrics = [m for m in (*rewards, *RATIOS) if all(m in s for s in seeds)]
        attacks[attack] = {
            **{metric: sum(s[metric] for s in seeds) / len(seeds) for metric in metrics},
            **{
                f"{metric}_goal": goal_over_seeds([s[metric] for s in seeds], HONEST_REWARD_GOAL)
                for metric in RATIOS
                if metric in metrics
            },
            "seeds": per_seed,
        }
    return {
        "eval_questions": spec.eval_questions,
        "eval_completions": spec.eval_completions,
        "goal": HONEST_REWARD_GOAL,
        "attacks": attacks,
    }


def held_out_lines(section: dict[str, Any] | None) -> list[str]:
    """The summary.md paragraph for a ``held_out`` section (none when it is empty)."""
    if not section or not section["attacks"]:
        return []
    rows = [
        f"`{attack}` {row['eval_reward_on']:.3f} against {row['eval_reward_no_attack_on']:.3f}: "
        f"over no attack (on) {goal_text(row['honest_eval_ratio_on_same_goal'])}"
        + (
            f", over no attack (off) {goal_text(row['honest_eval_ratio_on_goal'])}"
            if "honest_eval_ratio_on_goal" in row
            else ""
        )
        + (
            ", over the honest nodes' own swarm (on) "
            + goal_text(row["honest_eval_ratio_on_honest_only_same_goal"])
            if "honest_eval_ratio_on_honest_only_same_goal" in row
            else ""
        )
        for attack, row in section["attacks"].items()
    ]
    return [
        "",
        f"Held-out reward after the last round (each honest node on {section['eval_questions']} "
        f"held-out questions x {section['eval_completions']} answers), defences on under "
        f"attack against no attack, and its ratio against the goal (at least "
        f"{section['goal']}; mean over seeds with its 95 % interval): " + "; ".join(rows) + ".",
    ]
