"""The attack experiment's numbers and figure: pure functions over measured runs.

``asr`` per attack (the Must-show metric of docs/security.md), by the attack's kind in
:mod:`.spec` (:func:`measure_of`): for a length-like attack (``LENGTH_ATTACKS``:
``length``, ``longest``, ``capped``) the honest mean completion length over the last 20 %
of rounds relative to the no-attack run; for the other ratio attacks (``flood`` and
``absurd``) the process's mean CPU per round, nothing subtracted (:mod:`.measure`),
relative to the no-attack run (each against the no-attack run with the same defence
setting and seed, then averaged over seeds); for every other attack the fraction of honest
nodes' own completions in the last 20 % of rounds that carry the payload. Runs recorded
before the whole-round measure existed fall back to the old one (the round without the
attackers' own share and train). ``sets`` checks the goals with the defences on over the
attacks the defaults may be tuned on and, apart, the held-out ones (:mod:`.defended`).

Beside ``asr``, per attack: the per-round payload rate with the defences off, averaged
over seeds (``payload_by_round_off``), its least-squares slope per round and its first-
and last-half means, so a rising payload shows; for ``flood`` and ``absurd`` the CPU
ratios (``cpu_ratio_off`` / ``cpu_ratio_on``, the same as ``asr``), the honest nodes' own
CPU's per honest node (``honest_cpu_ratio_*``: the attackers' work in the same process
taken out, NaN for runs recorded before it), the old measure's (``round_s_ratio_*``) and
the nats-server's (``server_cpu_ratio_*``, where measured).

For the payload attacks, ``payload_no_attack_on`` / ``_off``: the same detector's rate on
honest completions in the no-attack run (text after the answer tag is also honest text),
over the seeds whose no-attack runs measured it.

``honest_reward_ratio_on`` compares the honest nodes under attack with the same nodes in the
no-attack swarm with the defences off, where every peer is honest (more sharing than an
attacked swarm can give them, and none of the defences' own cost);
``honest_reward_ratio_on_same`` with the no-attack swarm with the defences on (what the
attack itself costs a defended node: the two runs share seed, questions and defences, so
they stay close where nothing of the attackers' is trained on, where the defences-off
reference moves with the defended run's own noise); ``honest_reward_ratio_on_solo`` compares
them with the same nodes sharing nothing (the ``B/0`` no-attack run): at 1 or above, sharing
under attack with the defences on still paid; ``honest_reward_ratio_on_honest_only``
compares them with the same honest nodes in a swarm of their own (the ``I/J@n`` no-attack
run: the attackers absent rather than refused), what a perfect defence would leave them.
``honest_reward_ratio_on_goal`` / ``_on_same_goal``: the same against the goal of 0.9, by
the Student's t interval over the seeds (met, missed or undecided; :func:`goal_over_seeds`).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sapo_async.experiment.attack.defended import (
    defended,
    defended_lines,
    goal_sets,
    honest_reward,
    sets_lines,
)
from sapo_async.experiment.attack.held_out import HONEST_REWARD_GOAL, held_out, held_out_lines
from sapo_async.experiment.attack.measure import COST_METRICS, cost_ratios, ratio, round_cpu
from sapo_async.experiment.attack.over_time import by_quarter
from sapo_async.experiment.attack.spec import (
    KNOWN_ATTACKS,
    LENGTH_ATTACKS,
    RATIO_ATTACKS,
    AttackSpec,
    RunMeasure,
    honest_only_label,
)
from sapo_async.experiment.environment import environments
from sapo_async.experiment.report import goal_over_seeds, goal_text
from sapo_async.node.report import drop_rates
from sapo_async.wire.reasons import AFTER_ADMISSION

__all__ = ["markdown_table", "slope", "summarise", "write_outputs"]


_SIZES = (
    *("nodes", "attackers", "rounds", "seeds", "questions_per_round", "completions_per_question"),
    *("local", "external", "max_new_tokens", "train_layers", "lr"),
)
"""The sizes a summary states (``seeds``: how many)."""


def _tail(values: Sequence[float]) -> list[float]:
    n = max(1, len(values) // 5)
    return list(values[-n:])


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def measure_of(attack: str) -> str:
    """What ``asr`` measures for ``attack``: ``"length"`` (:data:`LENGTH_ATTACKS`: the
    honest completion length over the no-attack run's), ``"cpu"`` (the other ratio
    attacks, :data:`RATIO_ATTACKS`: CPU per round over the no-attack run's) or
    ``"payload"`` (the payload rate)."""
    if attack in LENGTH_ATTACKS:
        return "length"
    return "cpu" if attack in RATIO_ATTACKS else "payload"


def _asr(attack: str, run: RunMeasure, base: RunMeasure) -> float:
    measure = measure_of(attack)
    if measure == "length":
        return _mean(_tail(run.length)) / max(_mean(_tail(base.length)), 1e-12)
    if measure == "cpu":
        return ratio(round_cpu(run), round_cpu(base))
    return _mean(_tail(run.payload))


def slope(values: Sequence[float]) -> float:
    """The least-squares slope of ``values`` against their index (0 for fewer than 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    x_mean, y_mean = (n - 1) / 2, _mean(values)
    num = sum((x - x_mean) * (y - y_mean) for x, y in enumerate(values))
    return num / sum((x - x_mean) ** 2 for x in range(n))


def _trend(runs: Sequence[RunMeasure]) -> dict[str, Any]:
    """The defences-off payload rate per round, averaged over ``runs`` (one per seed)."""
    rounds = min((len(r.payload) for r in runs), default=0)
    by_round = [_mean([r.payload[i] for r in runs]) for i in range(rounds)]
    half = rounds // 2
    return {
        "payload_by_round_off": by_round,
        "payload_slope_off": slope(by_round),
        "payload_first_half_off": _mean(by_round[:half]),
        "payload_last_half_off": _mean(by_round[rounds - half :]) if half else float("nan"),
    }


def summarise(spec: AttackSpec, runs: Sequence[RunMeasure], *, seconds: float) -> dict[str, Any]:
    """The summary written to ``summary.json`` (see the module docstring).

    A cell averages over the seeds whose runs it needs are all there (an interrupted
    matrix gives fewer seeds; ``seeds`` in each row says which).
    """
    ij = f"{spec.local}/{spec.external}"
    solo = f"{spec.local + spec.external}/0"
    honest_only = honest_only_label(spec)
    key = {(r.attack, r.defences, r.seed, r.config): r for r in runs}
    attacks: dict[str, Any] = {}
    for attack in spec.attacks:
        per_seed: dict[str, Any] = {}
        for seed in spec.seeds:
            needed = [(attack, False), (attack, True), ("none", False), ("none", True)]
            if any((a, d, seed, ij) not in key for a, d in needed):
                continue
            off, on = key[(attack, False, seed, ij)], key[(attack, True, seed, ij)]
            base_off, base_on = key[("none", False, seed, ij)], key[("none", True, seed, ij)]
            honest = on.honest
            per_seed[str(seed)] = {
                "asr_off": _asr(attack, off, base_off),
                "asr_on": _asr(attack, on, base_on),
                "honest_reward_ratio_on": honest_reward(on, honest)
                / max(honest_reward(base_off, honest), 1e-12),
                "honest_reward_ratio_on_same": honest_reward(on, honest)
                / max(honest_reward(base_on, honest), 1e-12),
                "honest_reward_ratio_off": honest_reward(off, honest)
                / max(honest_reward(base_off, honest), 1e-12),
                "trained_from_attackers_off": off.trained_external.get("attacker", 0),
                "trained_from_attackers_on": on.trained_external.get("attacker", 0),
                "dropped_on": on.dropped,
                "quarantined_on": on.quarantined,
                "peak_rss_mb": max(off.peak_rss_mb, on.peak_rss_mb),
                "max_round_s_off": max(off.round_s),
                "max_round_s_on": max(on.round_s),
                "max_round_cpu_s_off": max(round_cpu(off)),
                "max_round_cpu_s_on": max(round_cpu(on)),
            }
            if ("none", False, seed, solo) in key:
                # The same honest nodes with no sharing at all: the bar a defence must
                # clear for sharing under attack to be worth it.
                alone = honest_reward(key[("none", False, seed, solo)], honest)
                per_seed[str(seed)] |= {
                    "honest_reward_ratio_on_solo": honest_reward(on, honest) / max(alone, 1e-12),
                    "honest_reward_ratio_off_solo": honest_reward(off, honest) / max(alone, 1e-12),
                }
            if ("none", False, seed, honest_only) in key:
                # The honest nodes in a swarm of their own: the attackers absent.
                own = honest_reward(key[("none", False, seed, honest_only)], honest)
                per_seed[str(seed)] |= {
                    "honest_reward_ratio_on_honest_only": honest_reward(on, honest)
                    / max(own, 1e-12),
                    "honest_reward_ratio_off_honest_only": honest_reward(off, honest)
                    / max(own, 1e-12),
                }
            for name, base in (
                ("payload_no_attack_off", base_off),
                ("payload_no_attack_on", base_on),
            ):
                if attack in base.payload_base:
                    per_seed[str(seed)][name] = _mean(_tail(base.payload_base[attack]))
            if measure_of(attack) == "cpu":
                per_seed[str(seed)] |= cost_ratios(off, on, base_off, base_on)
        if not per_seed:
            continue
        metrics = [
            "asr_off",
            "asr_on",
            "honest_reward_ratio_on",
            "honest_reward_ratio_on_same",
            "honest_reward_ratio_off",
        ]
        for control in ("solo", "honest_only"):
            if all(f"honest_reward_ratio_on_{control}" in s for s in per_seed.values()):
                metrics += [
                    f"honest_reward_ratio_on_{control}",
                    f"honest_reward_ratio_off_{control}",
                ]
        if measure_of(attack) == "cpu":
            metrics += COST_METRICS
        # Measured since the no-attack runs record each detector's rate: over the seeds
        # that have it (runs recorded before lack it).
        partial = {
            name: _mean(values)
            for name in ("payload_no_attack_off", "payload_no_attack_on")
            if (values := [s[name] for s in per_seed.values() if name in s])
        }
        attacks[attack] = (
            {metric: _mean([s[metric] for s in per_seed.values()]) for metric in metrics}
            | partial
            | _trend([key[(attack, False, int(seed), ij)] for seed in per_seed])
            | {
                # The goal against the seeds' spread: a mean under 0.9 over a few seeds whose
                # ratios swing 0.6 to 1.3 is not yet a miss.
                f"{metric}_goal": goal_over_seeds(
                    [s[metric] for s in per_seed.values()], HONEST_REWARD_GOAL
                )
                for metric in ("honest_reward_ratio_on", "honest_reward_ratio_on_same")
            }
            | {"asr_kind": _kind(attack), "seeds": per_seed}
        )
    fp = [
        key[("none", True, s, ij)].honest_groups_dropped
        / max(key[("none", True, s, ij)].honest_groups_judged, 1)
        for s in spec.seeds
        if ("none", True, s, ij) in key
    ]
    # Per check after admission, over the no-attack runs with the defences on (where every
    # producer is honest, so each drop is a false positive), per admitted group.
    after = drop_rates(
        (run.admitted, {r: n for r, n in run.dropped.items() if r in AFTER_ADMISSION})
        for s in spec.seeds
        if (run := key.get(("none", True, s, ij))) is not None
    )
    gain_seeds = [
        s
        for s in spec.seeds
        if all(
            k in key
            for k in (("none", True, s, ij), ("none", False, s, ij), ("none", False, s, solo))
        )
    ]

    def gain(on: bool) -> float:
        return _mean(
            [
                sum(map(sum, key[("none", on, s, ij)].rewards))
                / max(sum(map(sum, key[("none", False, s, solo)].rewards)), 1e-12)
                for s in gain_seeds
            ]
        )

    fp_rate = _mean(fp)
    defended_section = defended(spec, runs, _asr)
    return {
        "spec": spec.record(),
        "model": spec.model,
        "model_sha256": _model_sha256(spec.model),
        "transport": spec.transport,
        "sizes": {k: len(spec.seeds) if k == "seeds" else getattr(spec, k) for k in _SIZES},
        "attacks": attacks,
        "defended": defended_section,
        "sets": goal_sets(defended_section, TARGETS, fp_rate),
        "held_out": held_out(spec, runs),
        "honest_reward_by_quarter": by_quarter(spec, runs),
        "false_positive_rate": fp_rate,
        "false_positives_after_admission": {
            "admitted": after.admitted,
            "dropped": after.dropped,
            "rate": {reason: after.rate(reason) for reason in after.dropped},
        },
        "sharing_gain_on": gain(True),
        "sharing_gain_off": gain(False),
        "seconds": seconds,
        # Each run's own wall time, summed: what the summarised runs took whenever they ran
        # (``seconds`` is this call's, near 0 when it only summarised recorded runs).
        "run_seconds": sum(r.seconds for r in runs),
        # Whether the summarised runs ran on one environment (packages, CPU, kernels,
        # weights): runs resumed across machines need not reproduce each other bit for bit.
        "environments": environments(
            [
                (
                    f"{r.attack} {'on' if r.defences else 'off'} seed {r.seed} {r.config}",
                    r.environment,
                )
                for r in runs
            ]
        ),
        "conditions": (
            f"{platform.machine()} {platform.system()}, {os.cpu_count()} shared cores, "
            "runs in parallel worker processes (nice 10), one torch thread each, "
            + (
                "a private nats-server with JetStream per run, "
                if spec.transport == "nats"
                else "in-memory transport, "
            )
            + f"lockstep rounds, model {spec.model}, ledger off"
        ),
    }


def _model_sha256(model: str) -> str | None:
    """The packaged model's pinned digest (None for the tiny model, built locally)."""
    from sapo_async.policy.models.packaged import PACKAGED_MODELS

    packaged = PACKAGED_MODELS.get(model)
    return packaged.sha256 if packaged is not None else None


TARGETS = {a: 1.2 if a in RATIO_ATTACKS else 0.05 for a in KNOWN_ATTACKS if a != "wrong"}
"""The Must-show bound on ``asr_on`` per attack (issue 11; docs/security.md's goals): a
payload rate at most 0.05, a length or CPU ratio at most 1.2; none for ``wrong`` (a
control)."""


def markdown_table(summary: dict[str, Any]) -> str:
    """The results table of docs/security.md, from ``summary.json``'s contents."""
    lines = [
        "| attack | measure | defences off | defences on | target on | honest reward on "
        "/ no-attack (off) | honest reward on / no-attack (on) | honest reward off / "
        "no-attack | honest reward on / no sharing | honest reward on / honest nodes alone "
        "| trained from attackers off / on |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for attack, row in summary["attacks"].items():
        target = TARGETS.get(attack)
        met = "" if target is None else (" (met)" if row["asr_on"] <= target else " (missed)")
        seeds = row["seeds"].values()
        off = sum(s["trained_from_attackers_off"] for s in seeds)
        on = sum(s["trained_from_attackers_on"] for s in seeds)
        lines.append(
            f"| `{attack}` | {_short_kind(attack)} | {row['asr_off']:.3f} | "
            f"{row['asr_on']:.3f}{_floor(row)} | "
            f"{'-' if target is None else f'<= {target:g}'}{met} | "
            f"{row['honest_reward_ratio_on']:.2f} | "
            f"{_cell(row.get('honest_reward_ratio_on_same'))} | "
            f"{row['honest_reward_ratio_off']:.2f} | "
            f"{_cell(row.get('honest_reward_ratio_on_solo'))} | "
            f"{_cell(row.get('honest_reward_ratio_on_honest_only'))} | {off} / {on} |"
        )
    lines += [
        "",
        f"False positives (honest groups refused by a defence in the no-attack runs): "
        f"{summary['false_positive_rate']:.3f}. Sharing gain (cumulative reward of the "
        f"{summary['spec']['local']}/{summary['spec']['external']} swarm over "
        f"{summary['spec']['local'] + summary['spec']['external']}/0, no attack): defences on "
        f"{summary['sharing_gain_on']:.3f}, off {summary['sharing_gain_off']:.3f}.",
    ]
    goals = [
        f"`{attack}` {goal_text(row['honest_reward_ratio_on_goal'])}"
        for attack, row in summary["attacks"].items()
        if "honest_reward_ratio_on_goal" in row
    ]
    if goals:
        lines += [
            "",
            f"Honest reward on / no attack (off) against its goal (at least {HONEST_REWARD_GOAL}"
            "), mean over seeds with its 95 % interval (Student's t over the seeds): "
            + "; ".join(goals)
            + ".",
        ]
    lines += defended_lines(summary.get("defended"))
    lines += sets_lines(summary.get("sets"))
    lines += held_out_lines(summary.get("held_out"))
    after = summary.get("false_positives_after_admission")
    if after is not None:
        lines += [
            "",
            "Honest groups dropped after admission, per check (no-attack runs, defences on, "
            f"{after['admitted']} groups admitted; every drop is a false positive):",
            "",
            "| check | dropped | rate |",
            "|---|---|---|",
            *(
                f"| `{reason}` | {n} | {after['rate'][reason]:.4f} |"
                for reason, n in after["dropped"].items()
            ),
        ]
    return "\n".join(lines) + "\n"


def _floor(row: dict[str, Any]) -> str:
    """The no-attack rate of a payload detector beside the rate under attack, if measured."""
    base = row.get("payload_no_attack_on")
    return "" if base is None else f" (no attack {base:.3f})"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


_KINDS = {
    "length": "honest mean completion length / no-attack run (last 20 % of rounds)",
    "cpu": "process CPU per round (whole round) / no-attack run",
    "payload": "fraction of honest own completions carrying the payload (last 20 % of rounds)",
}
_SHORT_KINDS = {"length": "length / no-attack", "cpu": "round CPU / no-attack"}


def _kind(attack: str) -> str:
    return _KINDS[measure_of(attack)]


def write_outputs(summary: dict[str, Any], runs: Sequence[RunMeasure], out_dir: Path) -> None:
    """Write ``summary.json``, ``summary.md`` (the table) and ``attack.png`` (per attack,
    per round, off vs on)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "summary.md").write_text(markdown_table(summary))
    spec = summary["spec"]
    ij = f"{spec['local']}/{spec['external']}"
    attacks = list(spec["attacks"])
    fig, axes = plt.subplots(1, len(attacks), figsize=(3.2 * len(attacks), 3.0))
    if len(attacks) == 1:
        axes = [axes]
    for ax, attack in zip(axes, attacks, strict=True):
        for on, colour in ((False, "tab:red"), (True, "tab:blue")):
            traces = [
                _trace(attack, r, runs, ij)
                for r in runs
                if r.attack == attack and r.defences == on and r.config == ij
            ]
            traces = [t for t in traces if t]
            if not traces:
                continue
            rounds = min(len(t) for t in traces)
            mean = [_mean([t[i] for t in traces]) for i in range(rounds)]
            ax.plot(mean, color=colour, label="defences on" if on else "defences off")
        ax.set_title(attack)
        ax.set_xlabel("round")
        ax.set_ylabel(_short_kind(attack))
    if axes[0].get_legend_handles_labels()[0]:  # none when no run has a trace to plot
        axes[0].legend(fontsize=7)
    fig.suptitle("Honest nodes under attack (mean over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "attack.png", dpi=110)
    plt.close(fig)


def _short_kind(attack: str) -> str:
    return _SHORT_KINDS.get(measure_of(attack), "payload rate")


def _trace(attack: str, run: RunMeasure, runs: Sequence[RunMeasure], ij: str) -> list[float]:
    if attack not in RATIO_ATTACKS:
        return run.payload
    base = next(
        (
            r
            for r in runs
            if r.attack == "none"
            and r.defences == run.defences
            and r.seed == run.seed
            and r.config == ij
        ),
        None,
    )
    if base is None:
        return []
    length = measure_of(attack) == "length"
    values, ref = (run.length, base.length) if length else (round_cpu(run), round_cpu(base))
    return [v / max(b, 1e-12) for v, b in zip(values, ref, strict=False)]
