"""Results of the async paper table: JSON in the lockstep schema plus what only it records.

Writes ``<regime>.json`` (the lockstep keys ``spec``, ``seconds``, ``paper_cumulative``,
``runs``, ``cumulative``, ``ratio_to_baseline``, ``rounds_to_threshold``, plus ``path``,
``families``, ``family_ratio_to_baseline``, ``staleness``, ``pace``, ``filters``,
:mod:`.paper_table_ratios`' ``defences``, ``held_out``, ``ratios`` and ``defences_off``,
and for a swarm of two models :mod:`.paper_table_models`' ``per_model``),
``<regime>.md`` (tables), ``<regime>.png`` (per-node traces, first seed) and one
``family-<name>.png`` per task family (swarm mean reward per round, mean over seeds, one
line per arm). Pure functions over :class:`~sapo_async.experiment.paper_table_async_spec.AsyncRun`
results; nothing here runs a model.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapo_async.experiment.environment import environments
from sapo_async.experiment.paper_table_models import model_lines, per_model
from sapo_async.experiment.paper_table_ratios import (
    arm_defences,
    defences_off,
    held_out,
    over_seeds,
    ratio_lines,
)
from sapo_async.experiment.report import (
    PAPER_CUMULATIVE,
    cumulative_reward,
    markdown_table,
    moving_average,
    plot_traces,
    rounds_to_threshold,
)

if TYPE_CHECKING:
    from sapo_async.experiment.paper_table_async_spec import AsyncRun, AsyncSpec

__all__ = ["family_means", "pace", "write_async_outputs"]


def family_means(run: AsyncRun) -> dict[str, float]:
    """Mean reward of each family's own completions over the whole run."""
    out: dict[str, float] = {}
    for fam, nodes in run.family_rewards.items():
        total = sum(s for node in nodes for s, _ in node)
        count = sum(n for node in nodes for _, n in node)
        out[fam] = total / count if count else 0.0
    return out


def family_curve(run: AsyncRun, family: str) -> list[float]:
    """Swarm mean reward of ``family`` per round (rounds where no node drew it: carried)."""
    nodes = run.family_rewards.get(family, [])
    rounds = min((len(n) for n in nodes), default=0)
    out: list[float] = []
    for r in range(rounds):
        s = sum(node[r][0] for node in nodes)
        n = sum(node[r][1] for node in nodes)
        out.append(s / n if n else (out[-1] if out else 0.0))
    return out


def pace(run: AsyncRun) -> dict[str, float]:
    """How far the nodes drifted apart: the widest gap in completed rounds between the
    fastest and slowest node at any moment, and each node's seconds per round."""
    events = sorted((t, i) for i, ts in enumerate(run.ended_s) for t in ts)
    done = [0] * len(run.ended_s)
    widest = 0
    for _, i in events:
        done[i] += 1
        widest = max(widest, max(done) - min(done))
    per_round = [ts[-1] / len(ts) for ts in run.ended_s if ts]
    return {
        "widest_round_gap": float(widest),
        "seconds_per_round_min": min(per_round, default=0.0),
        "seconds_per_round_max": max(per_round, default=0.0),
        "first_node_done_s": min((ts[-1] for ts in run.ended_s if ts), default=0.0),
        "last_node_done_s": max((ts[-1] for ts in run.ended_s if ts), default=0.0),
    }


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {
        "n": len(ordered),
        "p01": q(0.01),
        "p50": q(0.5),
        "p99": q(0.99),
        "max_abs": max(abs(v) for v in ordered),
    }


def _plot_families(spec: AsyncSpec, results: Sequence[AsyncRun], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({f for r in results for f in r.family_rewards})
    written = []
    for fam in families:
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        for arm in spec.all_arms:
            curves = [family_curve(r, fam) for r in results if r.config == arm]
            curves = [c for c in curves if c]
            if not curves:
                continue
            rounds = min(len(c) for c in curves)
            mean = [statistics.fmean(c[k] for c in curves) for k in range(rounds)]
            ax.plot(moving_average(mean, 10), label=arm, linewidth=1.6)
        ax.set_xlabel("round")
        ax.set_ylabel("training reward")
        ax.set_title(
            f"{fam}: swarm mean (10-round moving average, mean over the seeds each arm ran)"
        )
        ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"family-{fam}.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def _round_run(run: AsyncRun) -> dict[str, Any]:
    data = asdict(run)
    data["rewards"] = [[round(x, 5) for x in node] for node in run.rewards]
    data["ended_s"] = [[round(x, 2) for x in node] for node in run.ended_s]
    data["log_ratios"] = _quantiles(run.log_ratios)
    data["family_rewards"] = {
        f: [[[round(s, 4), int(n)] for s, n in node] for node in nodes]
        for f, nodes in run.family_rewards.items()
    }
    # A mixed swarm's only: a one-model run's record as before.
    for key in ("models", "retokenised", "cross_model"):
        if not data[key]:
            del data[key]
    return data


def write_async_outputs(
    spec: AsyncSpec, results: Sequence[AsyncRun], out_dir: Path, *, seconds: float
) -> dict[str, Any]:
    """Write ``<regime>.json``, ``<regime>.md`` and figures into ``out_dir``; return the
    summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    order = [a for a in spec.all_arms if any(r.config == a for r in results)]
    baseline = spec.arms[0]
    by_config: dict[str, dict[int, list[list[float]]]] = {c: {} for c in order}
    runs: dict[tuple[str, int], AsyncRun] = {}
    for res in results:
        by_config[res.config][res.seed] = res.rewards
        runs[(res.config, res.seed)] = res
    seed0 = spec.seeds[0]
    first = {c: by_config[c][seed0] for c in order if seed0 in by_config[c]}
    if first:
        plot_traces(
            first,
            out_dir / f"{spec.stem}.png",
            title=f"async path, {spec.stem}, seed {seed0}: per-node training reward",
        )
    family_figures = _plot_families(spec, results, out_dir)

    by_config.setdefault(baseline, {})

    def ratio(c: str, s: int) -> float | None:
        """None where the baseline earned nothing (no ratio to take)."""
        base = cumulative_reward(by_config[baseline][s])
        return cumulative_reward(by_config[c][s]) / base if base > 0 else None

    families = {
        c: {str(s): family_means(runs[(c, s)]) for s in sorted(by_config[c])} for c in order
    }
    base_families = families.get(baseline, {})
    family_ratio = {
        c: {
            str(s): {
                f: (v / base_families[str(s)][f] if base_families[str(s)].get(f) else None)
                for f, v in families[c][str(s)].items()
            }
            for s in sorted(by_config[c])
            if s in by_config[baseline]
        }
        for c in order
    }
    staleness: dict[str, Any] = {}
    for c in order:
        hist: Counter[int] = Counter()
        for s in by_config[c]:
            hist.update(runs[(c, s)].staleness)
        n = sum(hist.values())
        staleness[c] = {
            "histogram": {str(k): v for k, v in sorted(hist.items())},
            "groups": n,
            "mean": sum(k * v for k, v in hist.items()) / n if n else 0.0,
        }
    ratios = {
        c: {str(s): ratio(c, s) for s in by_config[c] if s in by_config[baseline]} for c in order
    }
    held = held_out(spec, results, order)
    summary: dict[str, Any] = {
        "path": "async",
        "spec": asdict(spec),
        "seconds": seconds,
        "paper_cumulative": dict(PAPER_CUMULATIVE),
        "runs": [
            _round_run(r) for r in sorted(results, key=lambda r: (order.index(r.config), r.seed))
        ],
        "cumulative": {
            c: {str(s): cumulative_reward(t) for s, t in by_config[c].items()} for c in order
        },
        "ratio_to_baseline": ratios,
        "rounds_to_threshold": {
            c: {str(s): rounds_to_threshold(t, spec.threshold) for s, t in by_config[c].items()}
            for c in order
        },
        "families": families,
        "family_ratio_to_baseline": family_ratio,
        "family_figures": family_figures,
        "staleness": staleness,
        "pace": {c: {str(s): pace(runs[(c, s)]) for s in by_config[c]} for c in order},
        "filters": {
            c: {
                str(s): {
                    "failed": runs[(c, s)].external_failed,
                    "log_ratios": _quantiles(runs[(c, s)].log_ratios),
                }
                for s in by_config[c]
            }
            for c in order
            if "+" in c
        },
        "commitments": {c: {str(s): runs[(c, s)].commitments for s in by_config[c]} for c in order},
        # Every node's [defence] in each arm, as its runs recorded it (None: not recorded).
        "defences": arm_defences(order, results),
        "held_out": held,
        "ratios": over_seeds(ratios, held["ratio_to_baseline"], baseline),
        "defences_off": defences_off(ratios, held["ratio_to_baseline"]),
        # Whether the runs ran on one environment (packages, CPU, kernels, weights): a table
        # resumed on another machine need not reproduce its earlier runs bit for bit.
        "environments": environments(
            [(f"{c} seed {s}", runs[(c, s)].environment) for c in order for s in by_config[c]]
        ),
    }
    if spec.mixed:  # each model's nodes alone and shared (a one-model table's as before)
        summary["per_model"] = per_model(spec, results, order)
    (out_dir / f"{spec.stem}.json").write_text(json.dumps(summary, indent=1))
    (out_dir / f"{spec.stem}.md").write_text(_markdown(spec, summary, by_config, seconds))
    return summary


def _markdown(
    spec: AsyncSpec,
    summary: dict[str, Any],
    by_config: dict[str, dict[int, list[list[float]]]],
    seconds: float,
) -> str:
    order = [c for c in spec.all_arms if by_config.get(c)]
    layers = f"last {spec.train_layers} blocks train" if spec.train_layers else "all weights train"
    head = (
        f"### async path, {spec.model if spec.real else spec.regime + ' regime'} "
        f"({spec.nodes} nodes over NATS JetStream, "
        f"ledger on, {spec.rounds} rounds per node, B={spec.questions_per_round} x "
        f"L={spec.completions_per_question}, {spec.max_new_tokens} tokens, lr {spec.lr:g}, "
        f"{layers}, "
        f"tasks {spec.tasks}, "
        f"seeds {list(spec.seeds)}, {seconds / 60:.1f} min)\n\n"
    )
    table = markdown_table(
        {c: by_config[c] for c in order}, threshold=spec.threshold, baseline=spec.arms[0]
    )
    fams = sorted({f for c in summary["families"].values() for s in c.values() for f in s})
    lines = [
        "",
        "Per family: mean reward of own completions over the run (mean over seeds), and the "
        f"ratio to {spec.arms[0]} (mean over seeds):",
        "",
        "| config | " + " | ".join(fams) + " |",
        "|---|" + "---|" * len(fams),
    ]
    for c in order:
        cells = []
        for f in fams:
            vals = [s.get(f, 0.0) for s in summary["families"][c].values()]
            rats = [s.get(f) for s in summary["family_ratio_to_baseline"][c].values()]
            known = [r for r in rats if r is not None]
            mean_v = statistics.fmean(vals) if vals else 0.0
            # n/a: the baseline scored 0 on this family (no ratio to take).
            ratio = f"{statistics.fmean(known):.2f}x" if known else "n/a"
            cells.append(f"{mean_v:.4f} ({ratio})")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Staleness of the external groups trained on (rounds behind the newest group the "
        "receiver held from that producer), and pace (widest gap in completed rounds between "
        "nodes; seconds per round of the fastest and slowest node), over seeds:",
        "",
        "| config | groups | mean staleness | histogram | widest gap | s/round fastest..slowest |",
        "|---|---|---|---|---|---|",
    ]
    for c in order:
        st = summary["staleness"][c]
        paces = list(summary["pace"][c].values())
        gap = max((p["widest_round_gap"] for p in paces), default=0.0)
        lo = min((p["seconds_per_round_min"] for p in paces), default=0.0)
        hi = max((p["seconds_per_round_max"] for p in paces), default=0.0)
        hist = ", ".join(f"{k}: {v}" for k, v in st["histogram"].items())
        lines.append(
            f"| {c} | {st['groups']} | {st['mean']:.2f} | {hist} | {gap:.0f} | {lo:.2f}..{hi:.2f} |"
        )
    lines += ratio_lines(summary["ratios"], summary["defences_off"], summary["held_out"])
    if "per_model" in summary:
        lines += [
            "",
            f"Per model (node i runs {' / '.join(spec.models)} in turn; in {spec.arms[0]} "
            "each model's nodes train alone, in a shared arm beside the other model's):",
            *model_lines(summary["per_model"], spec.arms[0]),
        ]
    envs = summary["environments"]
    if envs["unrecorded"] or envs["differences"]:
        lines += [
            "",
            "Environments: not one for every run ("
            + "; ".join(
                (
                    [f"none recorded for {', '.join(envs['unrecorded'])}"]
                    if envs["unrecorded"]
                    else []
                )
                + envs["differences"]
            )
            + "), so a rerun need not reproduce every run bit for bit.",
        ]
    return head + table + "\n".join(lines) + "\n"
