"""The paper's I/J comparison (SAPO Table 1 / Fig. 2) on CPU, with common random numbers.

Eight nodes, each with its own copy of the tiny model, train for R rounds under each
configuration I/J in {8/0, 6/2, 4/4, 2/6}; every configuration sees the same questions and
the same sampling seeds (keyed by seed, node and round), so configurations differ only
through what the nodes train on.

Harness, not product: to make configurations comparable, the experiment runs the product's
round under the lockstep harness (:mod:`.lockstep`: nodes assembled as every node is, over
the in-memory transport): every node shares round r, the harness waits until every
collector has admitted the round's groups, then every node trains. In the product no node
waits for another; here the lockstep only removes timing noise from the comparison.
External groups are drawn from the latest round only (``max_staleness_rounds=0``), as in
the paper and GenRL. The ledger is off (it does not change learning). Every node runs a
node's own defences (``DefenceSpec()``): the experiment declares no defence setting.

Each (configuration, seed) runs in its own process (two at a time on two cores, one torch
thread each).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sapo_async.experiment.report import (
    PAPER_CUMULATIVE,
    cumulative_reward,
    markdown_table,
    plot_traces,
    rounds_to_threshold,
)

if TYPE_CHECKING:
    from sapo_async.node.spec import NodeSpec

__all__ = ["PRESETS", "ExperimentSpec", "RunResult", "node_spec", "run_experiment", "run_one"]

Regime = Literal["sparse", "dense"]


@dataclass(frozen=True, slots=True)
class ExperimentSpec:
    """One regime's experiment.

    Attributes:
        regime: which warm-started tiny model (see docs/learning.md).
        rounds: rounds per run.
        seeds: swarm seeds (common random numbers within a seed).
        configs: (I, J) pairs.
        nodes: nodes per swarm.
        questions_per_round / completions_per_question: B and L per node and round.
        lr: AdamW learning rate.
        threshold: reward for the rounds-to-threshold column (10-round moving average of
            the swarm mean).
        max_new_tokens: completion cap.
        tasks: task preset the tiny model is warm-started on and the nodes draw from
            (``cpu``: chain_sum; ``cpu_mix``: the async path's three families).
    """

    regime: Regime
    rounds: int
    seeds: tuple[int, ...] = (0, 1)
    configs: tuple[tuple[int, int], ...] = ((8, 0), (6, 2), (4, 4), (2, 6))
    nodes: int = 8
    questions_per_round: int = 8
    completions_per_question: int = 8
    lr: float = 3e-5
    threshold: float = 0.05
    max_new_tokens: int = 16
    tasks: str = "cpu"


PRESETS: dict[str, ExperimentSpec] = {
    # Sample-limited: the model rarely emits the <answer> tag the verifier demands.
    "sparse": ExperimentSpec(regime="sparse", rounds=200, threshold=0.05),
    # Skill-limited: tags known, partial credit, most groups informative.
    "dense": ExperimentSpec(regime="dense", rounds=120, threshold=0.2),
}


def quick(spec: ExperimentSpec) -> ExperimentSpec:
    """A seconds-long version of ``spec`` for tests: 3 nodes, 2 configurations, 3 rounds."""
    return replace(
        spec,
        rounds=3,
        seeds=(0,),
        configs=((4, 0), (2, 2)),
        nodes=3,
        questions_per_round=4,
        completions_per_question=4,
    )


@dataclass(frozen=True, slots=True)
class RunResult:
    """One (configuration, seed) run.

    Attributes:
        config: ``"I/J"``.
        seed: the swarm seed.
        rewards: ``rewards[node][round]``, each node's training reward.
        external_used: external groups trained on, summed over nodes and rounds.
        seconds: wall time of the run.
        rejected: collector rejections summed over nodes, by reason.
    """

    config: str
    seed: int
    rewards: list[list[float]]
    external_used: int
    seconds: float
    rejected: dict[str, int] = field(default_factory=dict)


def run_one(spec: ExperimentSpec, local: int, external: int, seed: int) -> RunResult:
    """Run one configuration and seed in this process (blocking).

    Raises:
        SapoError: a node failed.
    """
    from sapo_async.experiment.worker import run_blocking

    return run_blocking(_run_one, spec, local, external, seed)


def node_spec(spec: ExperimentSpec, local: int, external: int, seed: int) -> NodeSpec:
    """The node spec every node of one run shares (each gets its key and slot in
    :func:`~sapo_async.experiment.lockstep.lockstep`): ``spec``'s sizes, I/J, a node's
    own defences."""
    from sapo_async.experiment.lockstep import lockstep_spec

    return lockstep_spec(
        spec,
        swarm=f"paper-{spec.regime}-{seed}",
        local=local,
        external=external,
        seed=seed,
        tasks=spec.tasks,
    )


async def _run_one(spec: ExperimentSpec, local: int, external: int, seed: int) -> RunResult:
    from sapo_async.experiment.lockstep import lockstep
    from sapo_async.policy.models import load_tiny_model, tiny_spec

    t0 = time.perf_counter()
    mix = spec.tasks != "cpu"  # the regime's own model is warm-started on "cpu"
    common = node_spec(spec, local, external, seed)

    def own_model(_: int, node_spec: NodeSpec) -> NodeSpec:
        if not mix:
            return node_spec
        return node_spec.replace(model=load_tiny_model(tiny_spec(spec.regime, tasks=spec.tasks)))

    rewards: list[list[float]] = [[] for _ in range(spec.nodes)]
    used = 0
    rejected: dict[str, int] = {}
    # Keys from (seed, node) so hashes, hence the canonical candidate order, repeat.
    async with lockstep(
        common, spec.nodes, key_label=f"sapo-paper-table:{seed}", spec_of=own_model
    ) as swarm:
        for r in range(spec.rounds):
            shared = [await swarm.share(i) for i in range(spec.nodes)]
            expected = (spec.nodes - 1) * spec.questions_per_round * (r + 1)
            for node in swarm.nodes:
                await node.collector.wait_accepted(expected, timeout=60)
            for i, s in enumerate(shared):
                report = await swarm.train(i, s)
                rewards[i].append(report.reward_mean)
                used += report.external_total
        for node in swarm.nodes:
            for reason, n in node.collector.statistics().rejected.items():
                rejected[reason] = rejected.get(reason, 0) + n
    return RunResult(f"{local}/{external}", seed, rewards, used, time.perf_counter() - t0, rejected)


def _run_in_worker(args: tuple[ExperimentSpec, int, int, int]) -> RunResult:
    spec, local, external, seed = args
    return run_one(spec, local, external, seed)


def run_experiment(
    spec: ExperimentSpec,
    out_dir: Path,
    *,
    workers: int = 2,
    on_result: Callable[[RunResult], None] | None = None,
) -> dict[str, Any]:
    """Run every (configuration, seed) of ``spec``, then write results, table and figure.

    Args:
        spec: the experiment.
        out_dir: where ``<regime>.json``, ``<regime>.md`` and ``<regime>.png`` go.
        workers: processes running at once (1 runs in this process).
        on_result: called as each run finishes (progress display).

    Returns:
        The summary written to ``<regime>.json``.
    """
    from sapo_async.policy.models import ensure_tiny_model, tiny_spec

    # build once, before the workers race for it
    ensure_tiny_model(tiny_spec(spec.regime, tasks=spec.tasks))
    jobs = [(spec, i, j, seed) for (i, j) in spec.configs for seed in spec.seeds]
    results: list[RunResult] = []
    t0 = time.perf_counter()
    if workers <= 1:
        for job in jobs:
            results.append(_run_in_worker(job))
            if on_result:
                on_result(results[-1])
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_run_in_worker, job) for job in jobs]
            for fut in as_completed(futures):
                results.append(fut.result())
                if on_result:
                    on_result(results[-1])
    return write_outputs(spec, results, out_dir, seconds=time.perf_counter() - t0)


def write_outputs(
    spec: ExperimentSpec, results: Sequence[RunResult], out_dir: Path, *, seconds: float
) -> dict[str, Any]:
    """Write ``<regime>.json``, ``<regime>.md`` and ``<regime>.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    order = [f"{i}/{j}" for i, j in spec.configs]
    by_config: dict[str, dict[int, list[list[float]]]] = {c: {} for c in order}
    for res in results:
        by_config[res.config][res.seed] = res.rewards
    baseline = order[0]
    table = markdown_table(by_config, threshold=spec.threshold, baseline=baseline)
    seed0 = min(spec.seeds)
    plot_traces(
        {c: by_config[c][seed0] for c in order},
        out_dir / f"{spec.regime}.png",
        title=f"{spec.regime} regime, seed {seed0}: per-node training reward",
    )
    summary: dict[str, Any] = {
        "spec": asdict(spec),
        "seconds": seconds,
        "paper_cumulative": dict(PAPER_CUMULATIVE),
        "runs": [asdict(r) for r in sorted(results, key=lambda r: (order.index(r.config), r.seed))],
        "cumulative": {
            c: {str(s): cumulative_reward(t) for s, t in by_config[c].items()} for c in order
        },
        "ratio_to_baseline": {
            c: {
                str(s): cumulative_reward(t) / max(cumulative_reward(by_config[baseline][s]), 1e-12)
                for s, t in by_config[c].items()
                if s in by_config[baseline]
            }
            for c in order
        },
        "rounds_to_threshold": {
            c: {str(s): rounds_to_threshold(t, spec.threshold) for s, t in by_config[c].items()}
            for c in order
        },
    }
    (out_dir / f"{spec.regime}.json").write_text(json.dumps(summary, indent=1))
    (out_dir / f"{spec.regime}.md").write_text(
        f"### {spec.regime} regime ({spec.nodes} nodes, {spec.rounds} rounds, "
        f"B={spec.questions_per_round} x L={spec.completions_per_question}, lr {spec.lr:g}, "
        f"seeds {list(spec.seeds)}, "
        f"{seconds / 60:.1f} min)\n\n{table}"
    )
    return summary
