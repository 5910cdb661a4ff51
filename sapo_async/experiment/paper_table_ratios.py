"""The async paper table's sections beside its training-reward ratios: the defence each
arm ran, held-out reward, the sharing gain with the defences on and off, and ratios over
seeds with their intervals (``docs/results/paper-table-real/summary.json``).

Pure functions over :class:`~sapo_async.experiment.paper_table_async_spec.AsyncRun`
results and the table's ``ratio_to_baseline`` (``{arm: {seed: ratio}}``); nothing here
runs a model. Seeds are strings, as the table's JSON keys are.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sapo_async.experiment.paper_table_async_spec import DEFENCES_OFF, defended_arm
from sapo_async.experiment.report import goal_over_seeds, goal_text

if TYPE_CHECKING:
    from sapo_async.experiment.paper_table_async_spec import AsyncRun, AsyncSpec

__all__ = [
    "GOAL_RATIO",
    "HELD_OUT_GOAL",
    "arm_defences",
    "defences_off",
    "goal_cell",
    "held_out",
    "over_seeds",
    "ratio_cell",
    "ratio_lines",
]

GOAL_RATIO = 1.5
"""Issue 23's goal for half-shared over all-local training reward on every seed."""
HELD_OUT_GOAL = 1.0
"""Issue 58's goal for the held-out ratio of half-shared over all-local: above 1."""

Ratios = Mapping[str, Mapping[str, float | None]]


def arm_defences(order: Sequence[str], runs: Sequence[AsyncRun]) -> dict[str, Any]:
    """Every node's ``[defence]`` settings in each arm, as its runs recorded them; None for
    an arm whose runs recorded none (before it was kept) or recorded different ones."""
    out: dict[str, Any] = {}
    for arm in order:
        seen = [r.defence for r in runs if r.config == arm]
        out[arm] = seen[0] if seen and seen[0] and all(d == seen[0] for d in seen) else None
    return out


def held_out(spec: AsyncSpec, runs: Sequence[AsyncRun], order: Sequence[str]) -> dict[str, Any]:
    """The ``held_out`` section: each run's mean held-out reward over its nodes
    (``reward``: ``{arm: {seed: mean}}``, runs that evaluated only) and its ratio to the
    baseline arm's on the same seed (None where the baseline scored 0)."""
    baseline = spec.arms[0]
    reward = {
        arm: {
            str(r.seed): statistics.fmean(r.eval_rewards)
            for r in sorted(runs, key=lambda r: r.seed)
            if r.config == arm and r.eval_rewards
        }
        for arm in order
    }
    base = reward.get(baseline, {})
    return {
        "eval_questions": spec.eval_questions,
        "eval_completions": spec.eval_completions,
        "reward": {arm: seeds for arm, seeds in reward.items() if seeds},
        "ratio_to_baseline": {
            arm: {s: (v / base[s] if base[s] > 0 else None) for s, v in seeds.items() if s in base}
            for arm, seeds in reward.items()
            if seeds
        },
    }


def defences_off(training: Ratios, held: Ratios) -> dict[str, Any]:
    """The sharing gain with a node's defences and without: for each arm run with ``-off``
    too, per seed both ran, its ratio to the baseline (``training_on`` / ``training_off``,
    and ``held_out_on`` / ``held_out_off`` where both evaluated)."""
    out: dict[str, Any] = {}
    for off in training:
        on = defended_arm(off)
        if not off.endswith(DEFENCES_OFF) or on not in training:
            continue
        per_seed: dict[str, dict[str, float | None]] = {}
        for seed in training[on]:
            if seed not in training[off]:
                continue
            row = {"training_on": training[on][seed], "training_off": training[off][seed]}
            if seed in held.get(on, {}) and seed in held.get(off, {}):
                row |= {"held_out_on": held[on][seed], "held_out_off": held[off][seed]}
            per_seed[seed] = row
        if per_seed:
            out[on] = per_seed
    return out


def _over(values: Sequence[float | None], goal: float) -> dict[str, object] | None:
    known = [v for v in values if v is not None]
    return goal_over_seeds(known, goal) if known else None


def over_seeds(training: Ratios, held: Ratios, baseline: str) -> dict[str, dict[str, Any]]:
    """Per arm but the baseline: each seed's training-reward ratio beside its held-out ratio
    (``seeds``), and each ratio's mean over seeds with its 95 % Student-t interval against
    its goal (``training``: :data:`GOAL_RATIO`; ``held_out``: :data:`HELD_OUT_GOAL`;
    :func:`~sapo_async.experiment.report.goal_over_seeds`; None without a value)."""
    out: dict[str, dict[str, Any]] = {}
    for arm, seeds in training.items():
        if arm == baseline:
            continue
        arm_held = held.get(arm, {})
        out[arm] = {
            "seeds": {s: {"training": r, "held_out": arm_held.get(s)} for s, r in seeds.items()},
            "training": _over(list(seeds.values()), GOAL_RATIO),
            "held_out": _over(list(arm_held.values()), HELD_OUT_GOAL),
        }
    return out


def ratio_lines(
    ratios: Mapping[str, Mapping[str, Any]], gains: Mapping[str, Any], held: Mapping[str, Any]
) -> list[str]:
    """The markdown paragraphs of :func:`held_out`, :func:`over_seeds` and
    :func:`defences_off` (none when nothing evaluated held-out questions and no arm ran
    with its defences off)."""
    lines: list[str] = []
    if held["reward"]:
        rewards = "; ".join(
            f"{arm} " + ", ".join(f"{v:.3f}" for v in seeds.values())
            for arm, seeds in held["reward"].items()
        )
        lines += [
            "",
            f"Held-out reward (each node on the same {held['eval_questions']} held-out "
            f"questions x {held['eval_completions']} answers after its last round, mean over "
            f"nodes), per seed: {rewards}.",
            "",
            "Ratio to the baseline per seed, training reward and held-out reward, and the "
            "mean over seeds with its 95 % interval (n/a: the baseline scored 0):",
            "",
            "| config | per seed (training / held-out) | training | held-out |",
            "|---|---|---|---|",
        ]
        for arm, row in ratios.items():
            cells = ", ".join(
                f"{s}: {ratio_cell(v['training'])} / {ratio_cell(v['held_out'])}"
                for s, v in row["seeds"].items()
            )
            lines.append(
                f"| {arm} | {cells} | {goal_cell(row['training'])} | {goal_cell(row['held_out'])} |"
            )
    if gains:
        lines += [
            "",
            "Sharing gain with a node's defences and with them off (ratio to the baseline, "
            "training / held-out):",
            "",
            "| config | seed | defences on | defences off |",
            "|---|---|---|---|",
        ]
        for arm, seeds in gains.items():
            for s, row in seeds.items():
                on = f"{ratio_cell(row['training_on'])} / {ratio_cell(row.get('held_out_on'))}"
                off = f"{ratio_cell(row['training_off'])} / {ratio_cell(row.get('held_out_off'))}"
                lines.append(f"| {arm} | {s} | {on} | {off} |")
    return lines


def ratio_cell(value: float | None) -> str:
    """A ratio as a table cell (``n/a`` where there is none)."""
    return "n/a" if value is None else f"{value:.2f}x"


def goal_cell(goal: Mapping[str, object] | None) -> str:
    """A goal over seeds as a table cell (``n/a`` where there is none)."""
    return "n/a" if goal is None else goal_text(goal)
