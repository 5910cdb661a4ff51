"""The attack summary's ``honest_reward_by_quarter``: where in a run the honest reward goes.

The goal's ratio (:mod:`.summary`) sums the honest nodes' reward over every round, so an
attack whose cost grows with the rounds reads the same as one that costs a little
throughout. This splits the rounds into four equal parts (the last takes the remainder) and
gives the honest nodes' mean reward a completion in each, per attack with the defences on
and off and for the no-attack runs, each the mean over the seeds whose runs are all there.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure

__all__ = ["by_quarter", "quarters"]


def quarters(values: Sequence[float]) -> list[float]:
    """The mean of each quarter of ``values`` (the last quarter takes the remainder)."""
    n = len(values) // 4
    if n == 0:
        return []
    cuts = [0, n, 2 * n, 3 * n, len(values)]
    return [sum(values[a:b]) / (b - a) for a, b in itertools.pairwise(cuts)]


def _honest_quarters(run: RunMeasure, honest: Sequence[int]) -> list[float]:
    rounds = len(run.rewards[honest[0]])
    per_round = [sum(run.rewards[i][r] for i in honest) / len(honest) for r in range(rounds)]
    return quarters(per_round)


def by_quarter(spec: AttackSpec, runs: Sequence[RunMeasure]) -> dict[str, Any]:
    """Per attack: ``on`` / ``off`` and ``no_attack_on`` / ``no_attack_off``, four means each
    (the attack runs' honest nodes in every run), the ``seeds`` they average and each
    seed's last quarter (``last_quarter_by_seed``, in the order of ``seeds``); a cell
    averages the seeds that have its attack run and both no-attack runs. Runs of fewer
    than four rounds have no quarters: an empty table."""
    ij = f"{spec.local}/{spec.external}"
    key = {(r.attack, r.defences, r.seed, r.config): r for r in runs}
    out: dict[str, Any] = {}
    for attack in spec.attacks:
        cells: dict[str, list[list[float]]] = {}
        seeds: list[int] = []
        for seed in spec.seeds:
            base = {on: key.get(("none", on, seed, ij)) for on in (False, True)}
            if base[False] is None or base[True] is None:
                continue
            attacked = {on: key.get((attack, on, seed, ij)) for on in (False, True)}
            honest = next((r.honest for r in attacked.values() if r is not None), None)
            if honest is None:
                continue
            seeds.append(seed)
            for on, run in attacked.items():
                if run is not None:
                    cells.setdefault("on" if on else "off", []).append(
                        _honest_quarters(run, honest)
                    )
            for on, run in base.items():
                cells.setdefault(f"no_attack_{'on' if on else 'off'}", []).append(
                    _honest_quarters(run, honest)  # type: ignore[arg-type]  # checked above
                )
        if not seeds or not next(iter(cells.values()))[0]:
            continue  # no seed, or fewer than four rounds: no quarters
        whole = {n: qs for n, qs in cells.items() if all(len(q) == len(qs[0]) for q in qs)}
        out[attack] = {
            name: [sum(q[i] for q in qs) / len(qs) for i in range(len(qs[0]))]
            for name, qs in whole.items()
        } | {
            "seeds": seeds,
            # Each seed's own last quarter: whether the means' gap is every seed's or one's.
            "last_quarter_by_seed": {name: [q[-1] for q in qs] for name, qs in whole.items()},
        }
    return out
