"""The two-model table's comparison per model (issue 58): each model's nodes alone and
shared, from a mixed swarm's runs (:attr:`~.paper_table_async_spec.AsyncSpec.mixed`).

In a swarm of two models (node ``i`` runs the ``i % 2``-th) every arm's nodes of one model
are compared with the same model's nodes in the baseline arm, seed by seed: the baseline
(``"4/0"``: nothing shared) is each model alone, a shared arm (``"2/2"``, ``"2/2+ftis"``)
is that model trained beside the other, on text the other's nodes wrote, re-tokenised and
scored by its own verifier. Per model: cumulative training reward of its nodes, its ratio
to the baseline, and with ``eval_questions`` its nodes' held-out reward and that ratio,
with the intervals over seeds of :func:`~.paper_table_ratios.over_seeds`.

Pure functions over :class:`~.paper_table_async_spec.AsyncRun` results; a run that recorded
no per-node models (a one-model swarm) is in no model's section. Seeds are strings, as the
table's JSON keys are.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sapo_async.experiment.paper_table_ratios import goal_cell, over_seeds, ratio_cell
from sapo_async.experiment.report import cumulative_reward, rounds_to_threshold

if TYPE_CHECKING:
    from sapo_async.experiment.paper_table_async_spec import AsyncRun, AsyncSpec

__all__ = ["model_lines", "per_model"]


def _ratio(value: float, base: float) -> float | None:
    """None where the baseline earned nothing (no ratio to take)."""
    return value / base if base > 0 else None


def _one_model(
    spec: AsyncSpec, runs: Sequence[AsyncRun], order: Sequence[str], model: str
) -> dict[str, Any]:
    baseline = spec.arms[0]
    cumulative: dict[str, dict[str, float]] = {}
    reached: dict[str, dict[str, int | None]] = {}
    held: dict[str, dict[str, float]] = {}
    retokenised: dict[str, dict[str, int]] = {}
    cross: dict[str, dict[str, int]] = {}
    for arm in order:
        for run in sorted((r for r in runs if r.config == arm), key=lambda r: r.seed):
            nodes = [i for i, m in enumerate(run.models) if m == model]
            if not nodes:
                continue
            trace = [run.rewards[i] for i in nodes]
            cumulative.setdefault(arm, {})[str(run.seed)] = cumulative_reward(trace)
            if run.retokenised:
                retokenised.setdefault(arm, {})[str(run.seed)] = sum(
                    run.retokenised[i] for i in nodes
                )
            if run.cross_model:
                cross.setdefault(arm, {})[str(run.seed)] = sum(run.cross_model[i] for i in nodes)
            reached.setdefault(arm, {})[str(run.seed)] = rounds_to_threshold(trace, spec.threshold)
            if run.eval_rewards:
                held.setdefault(arm, {})[str(run.seed)] = statistics.fmean(
                    run.eval_rewards[i] for i in nodes
                )
    base, held_base = cumulative.get(baseline, {}), held.get(baseline, {})
    training = {
        arm: {s: _ratio(v, base[s]) for s, v in seeds.items() if s in base}
        for arm, seeds in cumulative.items()
    }
    held_ratio = {
        arm: {s: _ratio(v, held_base[s]) for s, v in seeds.items() if s in held_base}
        for arm, seeds in held.items()
    }
    return {
        "nodes": [i for i in range(spec.nodes) if spec.node_model(i) == model],
        "cumulative": cumulative,
        "ratio_to_baseline": training,
        "rounds_to_threshold": reached,
        "retokenised": retokenised,
        "cross_model": cross,
        "held_out": {"reward": held, "ratio_to_baseline": held_ratio},
        "ratios": over_seeds(training, held_ratio, baseline),
    }


def per_model(spec: AsyncSpec, runs: Sequence[AsyncRun], order: Sequence[str]) -> dict[str, Any]:
    """The ``per_model`` section: for each model of ``spec``, the nodes that run it
    (``nodes``), their cumulative training reward (``cumulative``: ``{arm: {seed:
    value}}``), its ratio to the baseline arm on the same seed (``ratio_to_baseline``,
    None where the baseline earned nothing), rounds to the threshold, the external
    completions its nodes trained on re-tokenised from their text (``retokenised``:
    ``{arm: {seed: count}}``), the external groups they trained on from the other model's
    nodes (``cross_model``, the same shape), held-out reward and
    its ratio (``held_out``, runs that evaluated only) and both ratios over seeds with
    their intervals (``ratios``, :func:`~.paper_table_ratios.over_seeds`).

    Args:
        spec: the table (a mixed swarm's; a one-model spec gets its one model).
        runs: its runs; those without per-node models count for no model.
        order: the arms in the table's order.
    """
    return {model: _one_model(spec, runs, order, model) for model in spec.models}


def model_lines(models: Mapping[str, Mapping[str, Any]], baseline: str) -> list[str]:
    """The markdown paragraph of :func:`per_model`: one table per model (none without
    models)."""
    lines: list[str] = []
    for model, section in models.items():
        nodes = ", ".join(str(i) for i in section["nodes"])
        lines += [
            "",
            f"**{model}** (nodes {nodes}): cumulative training reward of its nodes per seed, "
            f"its ratio to {baseline} (the model alone) per seed, and the mean ratio over "
            "seeds with its 95 % interval, training and held-out (n/a: none, or the "
            "baseline scored 0), and the external groups its nodes trained on from the other "
            "model's nodes, per seed:",
            "",
            f"| config | cumulative per seed | ratio to {baseline} per seed | training | "
            "held-out | other model's groups |",
            "|---|---|---|---|---|---|",
        ]
        for arm, seeds in section["cumulative"].items():
            cums = ", ".join(f"{s}: {v:.2f}" for s, v in seeds.items())
            ratios = section["ratio_to_baseline"].get(arm, {})
            per_seed = ", ".join(f"{s}: {ratio_cell(r)}" for s, r in ratios.items()) or "n/a"
            cross = section["cross_model"].get(arm, {})
            cross_cell = ", ".join(f"{s}: {n}" for s, n in cross.items()) or "n/a"
            row = section["ratios"].get(arm)
            goals = (  # none for the baseline itself
                f"{goal_cell(row['training'])} | {goal_cell(row['held_out'])}" if row else " | "
            )
            lines.append(f"| {arm} | {cums} | {per_seed} | {goals} | {cross_cell} |")
    return lines
