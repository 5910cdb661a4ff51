"""Tables and figures for the paper-table experiment: pure functions over reward traces.

A trace is ``rewards[node][round]``: the mean reward of a node's own generated completions
in that round (its *training reward*, as the SAPO paper plots). Nothing here runs a model.

Paper figures (SAPO, arXiv 2509.08721, 8 x Qwen2.5-0.5B, 2000 rounds, cumulative training
reward summed over nodes): 8/0 = 561.79, 6/2 = 854.43, 4/4 = 1093.31, 2/6 = 945.87.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "PAPER_CUMULATIVE",
    "cumulative_reward",
    "goal_over_seeds",
    "goal_text",
    "markdown_table",
    "moving_average",
    "plot_traces",
    "rounds_to_threshold",
]

PAPER_CUMULATIVE: Mapping[str, float] = {
    "8/0": 561.79,
    "6/2": 854.43,
    "4/4": 1093.31,
    "2/6": 945.87,
}
"""Cumulative reward per I/J configuration reported by the SAPO paper (Table / Fig. 2)."""

Trace = Sequence[Sequence[float]]

_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t, 0.975 quantile, 1 to 30 degrees of freedom (the standard table, e.g. the
NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2); 1.96 beyond."""


def _t975(df: int) -> float:
    return _T_975[df - 1] if df <= len(_T_975) else 1.96


def goal_over_seeds(values: Sequence[float], goal: float) -> dict[str, object]:
    """Whether per-seed values clear ``goal`` (at least), with the uncertainty of their mean.

    Returns ``mean``, ``ci95`` (Student's t interval of the mean over seeds; ``None`` with
    fewer than 2 seeds), ``verdict`` (``"met"``: the whole interval at or above the goal;
    ``"missed"``: all of it below; ``"undecided"``: the goal inside it, or one seed) and
    ``seeds_to_decide``: how many seeds the interval would need to clear the goal if the
    mean and spread stayed as measured (``None`` when decided, or when the mean is so near
    the goal that more than 10,000 would be needed).
    """
    import statistics

    n = len(values)
    mean = statistics.fmean(values) if values else float("nan")
    out: dict[str, object] = {
        "mean": mean,
        "seeds": n,
        "ci95": None,
        "verdict": "undecided",
        "seeds_to_decide": None,
    }
    if n < 2:
        return out
    sd = statistics.stdev(values)
    half = _t975(n - 1) * sd / n**0.5
    lo, hi = mean - half, mean + half
    out["ci95"] = [lo, hi]
    if lo >= goal:
        out["verdict"] = "met"
    elif hi < goal:
        out["verdict"] = "missed"
    elif mean != goal:
        gap = abs(mean - goal)
        out["seeds_to_decide"] = next(
            (k for k in range(n + 1, 10_001) if _t975(k - 1) * sd / k**0.5 < gap), None
        )
    return out


def cumulative_reward(trace: Trace) -> float:
    """Sum of every node's reward over every round."""
    return float(sum(sum(node) for node in trace))


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (shorter windows at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out: list[float] = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def swarm_mean(trace: Trace) -> list[float]:
    """Mean over nodes, per round."""
    rounds = min(len(node) for node in trace)
    return [sum(node[r] for node in trace) / len(trace) for r in range(rounds)]


def rounds_to_threshold(trace: Trace, threshold: float, window: int = 10) -> int | None:
    """First round (1-based count) at which the swarm-mean reward's moving average reaches
    ``threshold``; None if it never does."""
    for i, v in enumerate(moving_average(swarm_mean(trace), window)):
        if i + 1 >= window and v >= threshold:
            return i + 1
    return None


def goal_text(goal: Mapping[str, object]) -> str:
    """:func:`goal_over_seeds`'s result in words: ``0.77 [0.56, 0.99] over 5 seeds:
    undecided, about 10 seeds would decide it``."""
    mean, seeds, interval, more = goal["mean"], goal["seeds"], goal["ci95"], goal["seeds_to_decide"]
    if not isinstance(interval, Sequence):
        return f"{mean:.2f} ({seeds} seed: undecided)"
    need = f", about {more} seeds would decide it" if more else ""
    lo, hi = interval
    return f"{mean:.2f} [{lo:.2f}, {hi:.2f}] over {seeds} seeds: {goal['verdict']}{need}"


def markdown_table(
    results: Mapping[str, Mapping[int, Trace]], *, threshold: float, baseline: str = "8/0"
) -> str:
    """One row per configuration and seed, then the mean over seeds, beside the paper.

    Args:
        results: ``results[config][seed] = trace``.
        threshold: reward threshold for the rounds-to-threshold column.
        baseline: configuration the ratios are taken against.
    """
    lines = [
        f"| config | seed | cumulative reward | ratio to {baseline} | rounds to "
        f"{threshold:g} | paper cumulative | paper ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    base = results.get(baseline, {})
    paper_base = PAPER_CUMULATIVE["8/0"]
    for config, by_seed in results.items():
        ratios = []
        for seed, trace in sorted(by_seed.items()):
            cum = cumulative_reward(trace)
            # nan where the baseline earned nothing (a real model at a tiny size can).
            base_cum = cumulative_reward(base[seed]) if seed in base else 0.0
            ratio = cum / base_cum if base_cum > 0 else float("nan")
            ratios.append(ratio)
            rtt = rounds_to_threshold(trace, threshold)
            lines.append(
                f"| {config} | {seed} | {cum:.2f} | {ratio:.2f}x | "
                f"{rtt if rtt is not None else 'never'} | "
                f"{_paper(config, 1.0)} | {_paper(config, paper_base)} |"
            )
        if len(by_seed) > 1:
            mean_cum = sum(cumulative_reward(t) for t in by_seed.values()) / len(by_seed)
            mean_ratio = sum(ratios) / len(ratios)
            lines.append(
                f"| **{config}** | mean | **{mean_cum:.2f}** | **{mean_ratio:.2f}x** | | | |"
            )
    return "\n".join(lines) + "\n"


def _paper(config: str, divisor: float) -> str:
    value = PAPER_CUMULATIVE.get(config)
    if value is None:
        return "-"
    return f"{value:.2f}" if divisor == 1.0 else f"{value / divisor:.2f}x"


def plot_traces(results: Mapping[str, Trace], path: Path, *, title: str, window: int = 10) -> None:
    """Per-node reward per round (thin) and its moving average (thick), one panel per
    configuration, written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(results)
    fig, axes = plt.subplots(1, len(configs), figsize=(4 * len(configs), 3.2), sharey=True)
    if len(configs) == 1:
        axes = [axes]
    for ax, config in zip(axes, configs, strict=True):
        trace = results[config]
        for node in trace:
            ax.plot(node, linewidth=0.4, alpha=0.35)
        ax.plot(moving_average(swarm_mean(trace), window), color="black", linewidth=2.0)
        ax.set_title(f"{config}  (cum {cumulative_reward(trace):.1f})")
        ax.set_xlabel("round")
    axes[0].set_ylabel("training reward")
    fig.suptitle(f"{title}  (thin: each node; black: swarm mean, {window}-round moving average)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
