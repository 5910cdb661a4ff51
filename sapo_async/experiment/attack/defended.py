"""The attack summary's ``defended`` section: what each attack costs a defended node.

The summary's ``attacks`` rows need all four runs of a seed (the attack and no attack, the
defences off and on), so a ``--defended-only`` matrix, which runs only the defended pair,
left them empty: the figure that matrix exists for was not in its summary. This section
needs only the pair: per attack and seed, the honest nodes' reward summed over the rounds
under attack and in the no-attack run with the same defences (``honest_reward_on``,
``honest_reward_no_attack_on``), their ratio (``honest_reward_ratio_on_same``, as in
:mod:`.summary`), and the external groups the honest nodes trained, by origin
(``trained_from_attackers_on``, ``trained_from_honest_on``), the completions their scoring
left out of those groups before judging them (the tail and stock-lead records' cost:
``left_out_from_attackers_on``, ``left_out_from_honest_on`` and, in the no-attack run,
``left_out_from_honest_no_attack_on``), and the attack's own measure
with the defences on (``asr_on``, as the ``attacks`` rows compute it: the payload rate in
honest nodes' own completions over the last rounds, or the length or CPU ratio to the
defended no-attack run); the ratio's mean against the goal over the seeds
(:func:`~sapo_async.experiment.report.goal_over_seeds`), the measure's mean and the trained
counts summed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sapo_async.experiment.attack.held_out import HONEST_REWARD_GOAL
from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure
from sapo_async.experiment.report import goal_over_seeds, goal_text

__all__ = ["defended", "defended_lines", "honest_reward", "left_out"]


def honest_reward(run: RunMeasure, nodes: Sequence[int]) -> float:
    """What ``nodes`` (indices into the swarm) earned in ``run``, summed over the rounds."""
    return sum(sum(run.rewards[i]) for i in nodes)


def left_out(run: RunMeasure, origin: str) -> int | None:
    """Completions the honest nodes left out of ``origin``'s groups (every reason); None
    for a run recorded before they were counted."""
    return None if run.left_out is None else sum(run.left_out.get(origin, {}).values())


def _total(values: Sequence[int | None]) -> int | None:
    """The sum, or None if a seed did not count it."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def defended(
    spec: AttackSpec,
    runs: Sequence[RunMeasure],
    asr: Callable[[str, RunMeasure, RunMeasure], float],
) -> dict[str, Any]:
    """The ``defended`` section (see the module docstring): per attack with at least one
    seed whose defended attack run and defended no-attack run are both there; ``asr``
    measures an attack run against its no-attack run (``asr(attack, run, base)``)."""
    ij = f"{spec.local}/{spec.external}"
    key = {(r.attack, r.defences, r.seed, r.config): r for r in runs}
    out: dict[str, Any] = {}
    for attack in spec.attacks:
        per_seed: dict[str, dict[str, Any]] = {}
        for seed in spec.seeds:
            on, base = key.get((attack, True, seed, ij)), key.get(("none", True, seed, ij))
            if on is None or base is None:
                continue
            reward, no_attack = honest_reward(on, on.honest), honest_reward(base, on.honest)
            per_seed[str(seed)] = {
                "honest_reward_on": reward,
                "honest_reward_no_attack_on": no_attack,
                "honest_reward_ratio_on_same": reward / max(no_attack, 1e-12),
                "trained_from_attackers_on": on.trained_external.get("attacker", 0),
                "trained_from_honest_on": on.trained_external.get("honest", 0),
                "asr_on": asr(attack, on, base),
                "left_out_from_attackers_on": left_out(on, "attacker"),
                "left_out_from_honest_on": left_out(on, "honest"),
                "left_out_from_honest_no_attack_on": left_out(base, "honest"),
            }
        if not per_seed:
            continue
        seeds = list(per_seed.values())
        ratios = [s["honest_reward_ratio_on_same"] for s in seeds]
        out[attack] = {
            "honest_reward_ratio_on_same": sum(ratios) / len(ratios),
            "honest_reward_ratio_on_same_goal": goal_over_seeds(ratios, HONEST_REWARD_GOAL),
            "trained_from_attackers_on": sum(s["trained_from_attackers_on"] for s in seeds),
            "trained_from_honest_on": sum(s["trained_from_honest_on"] for s in seeds),
            "asr_on": sum(s["asr_on"] for s in seeds) / len(seeds),
            "left_out_from_attackers_on": _total([s["left_out_from_attackers_on"] for s in seeds]),
            "left_out_from_honest_on": _total([s["left_out_from_honest_on"] for s in seeds]),
            "left_out_from_honest_no_attack_on": _total(
                [s["left_out_from_honest_no_attack_on"] for s in seeds]
            ),
            "seeds": per_seed,
        }
    return out


def defended_lines(section: dict[str, Any] | None) -> list[str]:
    """The summary.md paragraph for a ``defended`` section (none when it is empty)."""
    if not section:
        return []
    rows = [
        f"`{attack}` {goal_text(row['honest_reward_ratio_on_same_goal'])}, the honest nodes "
        f"trained {row['trained_from_attackers_on']} attacker groups and "
        f"{row['trained_from_honest_on']} honest ones, the attack's measure with the defences "
        f"on {row['asr_on']:.3f}{_left_out_text(row)}"
        for attack, row in section.items()
    ]
    return [
        "",
        "Honest reward under attack over no attack, both with the defences on (summed over "
        f"the rounds; mean over seeds with its 95 % interval, goal at least "
        f"{HONEST_REWARD_GOAL}): " + "; ".join(rows) + ".",
    ]


def _left_out_text(row: dict[str, Any]) -> str:
    """What the records left out, where every seed counted it."""
    keys = ("left_out_from_attackers_on", "left_out_from_honest_on")
    if any(row.get(k) is None for k in (*keys, "left_out_from_honest_no_attack_on")):
        return ""
    return (
        f", completions left out before judging {row[keys[0]]} of the attackers' and "
        f"{row[keys[1]]} of honest peers' ({row['left_out_from_honest_no_attack_on']} of "
        "honest peers' with no attack)"
    )
