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

Where the matrix ran the honest nodes in a swarm of their own with the defences on (the
``I/J@n`` control, the attackers absent rather than refused), also the honest reward there
(``honest_reward_honest_only_on``) and the ratio over it
(``honest_reward_ratio_on_honest_only_same``, with its goal). That ratio is the one the
goal of 0.9 is read on (``sets``): in the no-attack run each honest node has the
attackers' slots filled by honest peers, so even a defence that refuses every attacker
group before it is trained leaves the honest nodes what two peers earn them, not four
(docs/results/attack-real-evidence: 0.48 of the no-attack run for every attack stopped
outright, the same run to the third decimal). The ratio over the no-attack run stays in
the section and the table: it is what the attackers' presence costs, lost peers included.

From it, the summary's ``sets`` (:func:`goal_sets`): the goals over the attacks the
defaults may be tuned on and, apart, over the held-out ones
(:data:`~sapo_async.experiment.attack.spec.HELD_OUT_ATTACKS`), each attack's measure
against its bound and its honest reward ratio's verdict, and the no-attack runs' false
positives against theirs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sapo_async.experiment.attack.held_out import HONEST_REWARD_GOAL
from sapo_async.experiment.attack.spec import (
    HELD_OUT_ATTACKS,
    AttackSpec,
    RunMeasure,
    honest_only_label,
)
from sapo_async.experiment.report import goal_over_seeds, goal_text

__all__ = [
    "FALSE_POSITIVE_GOAL",
    "defended",
    "defended_lines",
    "goal_sets",
    "honest_reward",
    "left_out",
    "sets_lines",
]

ALONE = "honest_reward_ratio_on_honest_only_same"
"""Honest reward under attack over the honest nodes' own swarm, both defended."""

FALSE_POSITIVE_GOAL = 0.01
"""The bound on honest groups refused by a defence with no attack (docs/security.md)."""

SETS = {"tuning": "Tuning set", "held_out": "Held-out set"}
"""The ``sets`` section's sets, by key, and their names in summary.md."""


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
    alone = honest_only_label(spec)
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
            if (own := key.get(("none", True, seed, alone))) is not None:
                own_reward = honest_reward(own, on.honest)
                per_seed[str(seed)] |= {
                    "honest_reward_honest_only_on": own_reward,
                    ALONE: reward / max(own_reward, 1e-12),
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
        if all(ALONE in s for s in seeds):
            alone_ratios = [s[ALONE] for s in seeds]
            out[attack] |= {
                ALONE: sum(alone_ratios) / len(alone_ratios),
                f"{ALONE}_goal": goal_over_seeds(alone_ratios, HONEST_REWARD_GOAL),
            }
    return out


def reward_goal(row: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The honest-reward ratio the goal is read on for one ``defended`` row, and its
    verdict: over the honest nodes' own defended swarm where the matrix ran it, else over
    the defended no-attack run (see the module docstring)."""
    metric = ALONE if f"{ALONE}_goal" in row else "honest_reward_ratio_on_same"
    return metric, row[f"{metric}_goal"]


def defended_lines(section: dict[str, Any] | None) -> list[str]:
    """The summary.md paragraph for a ``defended`` section (none when it is empty)."""
    if not section:
        return []
    rows = [
        f"`{attack}` {goal_text(row['honest_reward_ratio_on_same_goal'])}"
        + (
            f" (over the honest nodes' own swarm {goal_text(row[f'{ALONE}_goal'])})"
            if f"{ALONE}_goal" in row
            else ""
        )
        + ", the honest nodes "
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


def _at_most(value: float, bound: float | None) -> str | None:
    """``"met"`` / ``"missed"`` for a measure bounded above (None: no bound; NaN: not
    measured, ``"undecided"``)."""
    if bound is None:
        return None
    return "undecided" if math.isnan(value) else "met" if value <= bound else "missed"


def _overall(verdicts: Sequence[str | None]) -> str:
    """One verdict of several: missed if any is, met if all are, else undecided."""
    given = [v for v in verdicts if v is not None]
    if "missed" in given:
        return "missed"
    return "met" if all(v == "met" for v in given) else "undecided"


def goal_sets(
    section: dict[str, Any], targets: Mapping[str, float], false_positive_rate: float
) -> dict[str, Any]:
    """The summary's ``sets`` (see the module docstring): per set with an attack in
    ``section`` (the ``defended`` section), its attacks' ``asr_on`` against ``targets``
    (none for a control) and ``honest_reward_ratio_on_same``'s verdict, each attack's and
    the set's overall verdict; ``false_positives``, the no-attack runs' (every set's)."""
    out: dict[str, Any] = {}
    for name in SETS:
        rows: dict[str, Any] = {}
        for attack, row in section.items():
            if (attack in HELD_OUT_ATTACKS) != (name == "held_out"):
                continue
            target = targets.get(attack)
            asr = _at_most(row["asr_on"], target)
            metric, goal = reward_goal(row)
            rows[attack] = {
                "asr_on": row["asr_on"],
                "asr_on_target": target,
                "asr_on_verdict": asr,
                "honest_reward_ratio_on_same": row["honest_reward_ratio_on_same"],
                "honest_reward_ratio_on_same_verdict": row["honest_reward_ratio_on_same_goal"][
                    "verdict"
                ],
                "honest_reward_goal_metric": metric,
                "honest_reward_goal_ratio": row[metric],
                "honest_reward_goal_verdict": goal["verdict"],
                "verdict": _overall([asr, goal["verdict"]]),
            }
        if rows:
            verdict = _overall([r["verdict"] for r in rows.values()])
            out[name] = {"verdict": verdict, "attacks": rows}
    out["false_positives"] = {
        "rate": false_positive_rate,
        "goal": FALSE_POSITIVE_GOAL,
        "verdict": _at_most(false_positive_rate, FALSE_POSITIVE_GOAL),
    }
    return out


def sets_lines(section: dict[str, Any] | None) -> list[str]:
    """The summary.md paragraph for a ``sets`` section (none when no set has an attack)."""
    if not section or not any(name in section for name in SETS):
        return []
    parts = []
    for name, label in SETS.items():
        if name not in section:
            continue
        rows = section[name]["attacks"]
        short = [
            f"`{a}` measure {r['asr_on']:.3f} {r['asr_on_verdict'] or 'with no target'}, "
            f"reward {r['honest_reward_goal_ratio']:.2f} {r['honest_reward_goal_verdict']}"
            for a, r in rows.items()
            if r["verdict"] != "met"
        ]
        parts.append(
            f"{label} ({', '.join(f'`{a}`' for a in rows)}): {section[name]['verdict']}"
            + (f" ({'; '.join(short)})" if short else "")
        )
    fp = section["false_positives"]
    return [
        "",
        "Goals with the defences on, by set (the attack's measure at most its target, honest "
        f"reward at least {HONEST_REWARD_GOAL} of the honest nodes' own swarm, defended too, "
        "or of the defended no-attack run where that swarm was not run; the held-out "
        "attacks, named before any default was tuned on them, apart). "
        + ". ".join(parts)
        + f". False positives with no attack {fp['rate']:.4f} (at most {fp['goal']}): "
        + f"{fp['verdict']}.",
    ]
