"""The paper's I/J comparison on the product's own path: nodes at their own pace over NATS.

Where :mod:`.paper_table` (``--path lockstep``) runs the nodes under a lockstep scheduler on
the in-memory transport with the ledger off, this runs each (arm, seed) as a swarm of
``nodes`` real nodes joined through :meth:`~sapo_async.node.swarm.Swarm.join`, the Python
API a user calls, by the runner ``sapo-async swarm`` uses too
(:func:`~sapo_async.node.runner.run_swarm`): a private nats-server with JetStream, the
swarm's contract on the embedded EVM (every node journals and commits its rounds), no
barrier and no round clock. Each node is an asyncio task of one process with its own round
counter; its generation and training run in worker threads, ``threads`` at a time, so nodes
drift apart by however the scheduler serves them, and what a node trains on is whatever its
buffer holds when it samples (groups at most ``max_staleness_rounds`` behind their
producer's newest, the product's default bound).

Same compute budget and same questions for every arm: each node runs ``rounds`` rounds,
and the questions and sampling seeds are keyed by (seed, node, round) as in the lockstep
harness (common random numbers); what differs between arms is what nodes train on, and,
here, when the groups they train on were produced.

Recorded per run: each node's training reward per round, per task family, the wall-clock
time each round ended (the nodes' pace), the staleness of every external group trained on
(rounds behind the newest group its receiver held from that producer), the ledger's
commitments, and for the ratio filter every importance ratio it saw.

Every run records each node's ``[defence]`` settings, and with ``eval_questions`` each
node's reward on held-out questions after its last round
(:func:`~sapo_async.experiment.held_out_eval.held_out_reward`, the attack experiment's).

Arms are ``"I/J"`` plus an optional filter on external groups: ``+tis`` (truncated
importance weights from the producer's log-probs, ``TrainerConfig.tis_cap``) or ``+ftis``
(drop groups whose importance ratio is extreme, :class:`~sapo_async.node.filters.RatioFilter`);
``+fresh`` draws external groups from their producer's newest round only
(``max_staleness_rounds = 0``, as the lockstep harness does), to measure what staleness costs.
A trailing ``-off`` runs the arm with every node's defences off (``[defence] active =
false``), a volunteer's defaults otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapo_async.experiment.paper_table_async_spec import (
    ASYNC_PRESETS,
    AsyncRun,
    AsyncSpec,
    arm_defence,
    parse_arm,
    quick_async,
)

if TYPE_CHECKING:
    from sapo_async.node.spec import NodeSpec

__all__ = [
    "ASYNC_PRESETS",
    "AsyncRun",
    "AsyncSpec",
    "parse_arm",
    "quick_async",
    "recorded_runs",
    "run_async_experiment",
    "run_async_one",
    "swarm_spec",
]


LAND_TIMEOUT_S = 120.0
"""A swarm of nodes at their own pace may end with a queue of commitments to land; 120 s
is a hang."""


def run_async_one(spec: AsyncSpec, arm: str, seed: int, *, progress: bool = True) -> AsyncRun:
    """Run one arm and seed as a swarm in this process (blocking).

    Raises:
        SapoError: a node failed.
    """
    from sapo_async.experiment.worker import run_blocking

    return run_blocking(_run_swarm, spec, arm, seed, progress)


def swarm_spec(spec: AsyncSpec, arm: str, seed: int, *, limiter: Any = None) -> NodeSpec:
    """The node spec every node of one (arm, seed) swarm shares (each gets its key, slot
    and model copy when it joins): ``spec``'s sizes, the arm's I/J and filter, the ledger
    on, a node's own defences (the experiment declares no defence setting), or with
    ``-off`` the same with ``active`` off (:func:`arm_defence`).

    Args:
        spec: the experiment.
        arm: ``"I/J"`` with an optional filter (:func:`parse_arm`).
        seed: the swarm seed.
        limiter: the worker-thread limiter the swarm's nodes share.
    """
    from sapo_async.node.filters import RatioFilter
    from sapo_async.node.spec import NodeSpec
    from sapo_async.policy.grpo.trainer import TrainerConfig

    local, external, filt = parse_arm(arm)
    return NodeSpec.build(
        swarm=f"paper-async-{seed}-{arm.replace('/', '-').replace('+', '-')}",
        **spec.node_settings(seed),
        trainer=TrainerConfig(lr=spec.lr, tis_cap=spec.tis_cap if filt == "tis" else None),
        local=local,
        external=external,
        max_staleness_rounds=0 if filt == "fresh" else spec.max_staleness_rounds,
        external_filter=RatioFilter(spec.ratio_cap) if filt == "ftis" else None,
        rounds=spec.rounds,
        start="all",
        ledger_enabled=True,
        limiter=limiter,
        defence=arm_defence(arm),
    )


async def _run_swarm(spec: AsyncSpec, arm: str, seed: int, progress: bool) -> AsyncRun:
    import anyio
    from eth_account import Account

    from sapo_async.experiment.environment import environment
    from sapo_async.node.lifecycle import Node
    from sapo_async.node.report import RoundReport
    from sapo_async.node.runner import run_swarm
    from sapo_async.policy.models import load_model, load_tiny_model, tiny_spec
    from sapo_async.wire import keccak256

    # Loaded once here (each model of a mixed swarm) and copied per node: transformers'
    # loading is not thread-safe, and nodes that join at once load in worker threads.
    loaded = (
        {m: load_model(m) for m in spec.models}
        if spec.real
        else {spec.model: load_tiny_model(tiny_spec(spec.regime, tasks=spec.tasks))}
    )
    common = swarm_spec(spec, arm, seed, limiter=anyio.CapacityLimiter(spec.threads))
    ratio_filter = common.training.external_filter
    reports: list[list[RoundReport]] = [[] for _ in range(spec.nodes)]
    learners: list[Any] = [None] * spec.nodes
    ended: list[list[float]] = [[] for _ in range(spec.nodes)]
    commitments: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    t0 = time.perf_counter()
    shown = [0]

    def show() -> None:
        done = [len(r) for r in reports]
        step = max(1, spec.rounds // 4)
        if progress and min(done) >= shown[0] + step:
            shown[0] = min(done) - min(done) % step
            print(
                f"    {arm} seed {seed}: rounds per node {min(done)}..{max(done)} of "
                f"{spec.rounds} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    def node_spec(i: int) -> NodeSpec:
        # Keys from (seed, node) so hashes, hence the canonical candidate order, repeat.
        account = Account.from_key(keccak256(f"sapo-paper-table:{seed}:{i}".encode()))
        return common.replace(
            name=f"node{i}",
            node_index=i,
            account=account,
            model=_copy(loaded[spec.node_model(i)]),
        )

    index = {f"node{i}": i for i in range(spec.nodes)}

    def reported(node: Node, report: RoundReport) -> None:
        reports[index[node.name]].append(report)
        ended[index[node.name]].append(time.perf_counter() - t0)
        show()

    def settled(node: Node) -> None:
        learners[index[node.name]] = node.learner  # evaluated once every node is done
        if node.recorder is not None:
            stats = node.recorder.statistics()
            commitments["confirmed"] += stats.landed
            commitments["pending"] += stats.pending
        rejected.update(node.collector.statistics().rejected)

    async with run_swarm(
        [node_spec(i) for i in range(spec.nodes)],
        log_dir=None,
        on_report=reported,
        on_settled=settled,
        land_timeout_s=LAND_TIMEOUT_S,
        join_at_once=True,  # the model is loaded above, once
        leave_when_settled=True,
    ) as run:
        await run.wait_settled(math.inf)  # the rounds take as long as they take
    seconds = time.perf_counter() - t0
    measured = _summarise(arm, seed, reports, ended, ratio_filter, commitments, rejected, seconds)
    t1 = time.perf_counter()
    held_out = await _held_out(spec, learners) if spec.eval_questions else []
    mixed = _mixed(spec, reports) if spec.mixed else {}  # a one-model run records none
    return dataclasses.replace(
        measured,
        environment=environment(loaded[spec.model].model)
        if not spec.mixed
        else environment(models={m: lm.model for m, lm in loaded.items()}),
        defence=common.defence.model_dump(mode="json"),
        eval_rewards=held_out,
        eval_s=time.perf_counter() - t1 if held_out else 0.0,
        **mixed,
    )


def _mixed(spec: AsyncSpec, reports: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """What a run of two models records beside a one-model run's: each node's model, the
    external completions it trained on re-tokenised from their text, and the external
    groups it trained on whose producer ran the other model."""
    models = [spec.node_model(i) for i in range(spec.nodes)]
    model_of = {node[0].node: models[i] for i, node in enumerate(reports) if node}
    return {
        "models": models,
        "retokenised": [sum(int(r.step.get("retokenised", 0)) for r in node) for node in reports],
        "cross_model": [
            sum(
                n
                for r in node
                for producer, n in r.external_used.items()
                if model_of.get(producer, models[i]) != models[i]
            )
            for i, node in enumerate(reports)
        ],
    }


def _copy(loaded: Any) -> Any:
    """A node's own copy of a loaded model's weights (its tokenizer is the loaded one)."""
    return dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))


async def _held_out(spec: AsyncSpec, learners: Sequence[Any]) -> list[float]:
    """Each node's held-out reward with its last weights, ``spec.threads`` nodes at a time
    (the nodes have left the swarm; their learners are kept)."""
    import anyio

    from sapo_async.experiment.held_out_eval import held_out_reward

    rewards = [0.0] * len(learners)
    slots = anyio.Semaphore(spec.threads)

    async def one(i: int, learner: Any) -> None:
        async with slots:
            rewards[i] = await held_out_reward(learner, spec.eval_questions, spec.eval_completions)

    async with anyio.create_task_group() as tg:
        for i, learner in enumerate(learners):
            tg.start_soon(one, i, learner)
    return rewards


def _summarise(  # noqa: PLR0917 - one private call site
    arm: str,
    seed: int,
    reports: Sequence[Sequence[Any]],
    ended: list[list[float]],
    ratio_filter: Any,
    commitments: Counter[str],
    rejected: Counter[str],
    seconds: float,
) -> AsyncRun:
    families = sorted({f for node in reports for r in node for f in r.reward_by_family})
    family_rewards = {
        f: [[list(r.reward_by_family.get(f, [0.0, 0.0])) for r in node] for node in reports]
        for f in families
    }
    staleness: Counter[int] = Counter(
        s for node in reports for r in node for s in r.external_staleness
    )
    failed: Counter[str] = Counter()
    for node in reports:
        for r in node:
            failed.update(r.external_failed)
    return AsyncRun(
        config=arm,
        seed=seed,
        rewards=[[r.reward_mean for r in node] for node in reports],
        family_rewards=family_rewards,
        ended_s=ended,
        staleness=dict(sorted(staleness.items())),
        external_used=sum(r.external_total for node in reports for r in node),
        received=sum(r.groups_received for node in reports for r in node),
        external_failed=dict(failed),
        log_ratios=list(ratio_filter.log_ratios) if ratio_filter is not None else [],
        commitments=dict(commitments),
        phase_s={
            phase: statistics.fmean(getattr(r, f"{phase}_s") for node in reports for r in node)
            for phase in ("generate", "publish", "score", "train")
        }
        if any(reports)
        else {},
        seconds=seconds,
        rejected=dict(rejected),
    )


_SAME_RUN_KEYS = (
    "regime",
    "tasks",
    "rounds",
    "nodes",
    "questions_per_round",
    "completions_per_question",
    "lr",
    "max_new_tokens",
    "max_staleness_rounds",
    "tis_cap",
    "ratio_cap",
    "threads",
    "model",
    "train_layers",
    "name",
)
_NEW_RUN_KEYS = {"eval_questions": 0, "eval_completions": 8}
"""Settings a table records since they were added, with the value a table recorded before
meant (none evaluated held-out questions)."""


def recorded_runs(spec: AsyncSpec, path: Path) -> list[AsyncRun]:
    """Runs already in ``path`` (a ``<regime>.json`` this experiment wrote) that ``spec``
    would run again with the same settings (``--resume``); none if the file is absent or
    was written with other settings. A run is kept only if it recorded the defence its arm
    runs now (a run recorded before the defences were recorded ran a node's defaults of its
    day, so it runs again). The ratio filter's raw log ratios are not stored (only their
    quantiles), so a resumed ``+ftis`` run reports none."""
    import json

    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    old = data.get("spec", {})
    if data.get("path") != "async" or any(old.get(k) != getattr(spec, k) for k in _SAME_RUN_KEYS):
        return []
    if any(old.get(k, default) != getattr(spec, k) for k, default in _NEW_RUN_KEYS.items()):
        return []
    wanted = set(spec.jobs())
    out = []
    for r in data.get("runs", []):
        if (r["config"], r["seed"]) not in wanted:
            continue
        if r.get("defence") != arm_defence(r["config"]).model_dump(mode="json"):
            continue
        fields = {f.name for f in dataclasses.fields(AsyncRun)}
        values = {k: v for k, v in r.items() if k in fields}
        values["staleness"] = {int(k): v for k, v in r["staleness"].items()}
        values["log_ratios"] = []
        out.append(AsyncRun(**values))
    return out


def recorded_seconds(path: Path) -> float:
    """The seconds the table at ``path`` recorded (0 if it has none)."""
    import json

    return float(json.loads(path.read_text()).get("seconds", 0.0)) if path.is_file() else 0.0


def _run_in_worker(args: tuple[AsyncSpec, str, int]) -> AsyncRun:
    spec, arm, seed = args
    return run_async_one(spec, arm, seed)


def run_async_experiment(
    spec: AsyncSpec,
    out_dir: Path,
    *,
    workers: int = 2,
    on_result: Callable[[AsyncRun], None] | None = None,
    on_failure: Callable[[str, int, BaseException], None] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run every (arm, seed) of ``spec`` (``workers`` swarms at once, one process each),
    writing ``<regime>.json``, ``<regime>.md`` and the figures into ``out_dir`` after each
    (so an interrupted run leaves what it measured)."""
    from sapo_async.experiment.environment import resume_note
    from sapo_async.experiment.paper_table_report import write_async_outputs
    from sapo_async.experiment.worker import WORKER_THREADS
    from sapo_async.policy.models import ensure_tiny_model, tiny_spec
    from sapo_async.policy.models.packaged import ensure_packaged_model

    # Once, before workers race to build or dequantise it.
    if spec.real:
        for model in spec.models:
            ensure_packaged_model(model)
    else:
        ensure_tiny_model(tiny_spec(spec.regime, tasks=spec.tasks))
    results: list[AsyncRun] = recorded_runs(spec, out_dir / f"{spec.stem}.json") if resume else []
    have = {(r.config, r.seed) for r in results}
    note = resume_note(
        [(f"{r.config} seed {r.seed}", r.environment) for r in results],
        torch_threads=WORKER_THREADS,
    )
    if note:
        print(f"  {note}", file=sys.stderr, flush=True)
    jobs = [(spec, arm, seed) for arm, seed in spec.jobs() if (arm, seed) not in have]
    # The table's time across sittings: a resumed table adds this call's to what it recorded.
    t0 = time.perf_counter() - (recorded_seconds(out_dir / f"{spec.stem}.json") if results else 0.0)

    def done(res: AsyncRun) -> None:
        results.append(res)
        write_async_outputs(spec, results, out_dir, seconds=time.perf_counter() - t0)
        if on_result:
            on_result(res)

    def failed(job: tuple[AsyncSpec, str, int], exc: BaseException) -> None:
        # One swarm failing (a node crashed) must not lose the others' results.
        if on_failure is None:
            raise exc
        on_failure(job[1], job[2], exc)

    if workers <= 1:
        for job in jobs:
            try:
                done(_run_in_worker(job))
            except Exception as exc:
                failed(job, exc)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(_run_in_worker, job): job for job in jobs}
            for fut in as_completed(futures):
                try:
                    res = fut.result()
                except Exception as exc:
                    failed(futures[fut], exc)
                else:
                    done(res)
    return write_async_outputs(spec, results, out_dir, seconds=time.perf_counter() - t0)
