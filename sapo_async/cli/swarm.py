"""``sapo-async swarm`` (a local swarm, the README's main job) and
``sapo-async experiment paper-table``.

Owns argument parsing, the live display and the closing audit; running the nodes and their
logs is :func:`sapo_async.node.runner.run_swarm`'s, the rest is in :mod:`sapo_async.node`
and :mod:`sapo_async.experiment`.
"""

# PLC0415: lazy imports keep `--help` fast; B008/PLR0917: typer's declarative options.
# ruff: noqa: B008, PLR0917

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import typer

from sapo_async.cli.boundary import require, require_setting, require_writable

__all__ = ["register"]


def swarm(
    nodes: int = typer.Option(8, min=1, help="Nodes in the swarm (one process, one NATS)."),
    local: int = typer.Option(4, min=0, help="I: own groups trained on per round."),
    external: int = typer.Option(4, min=0, help="J: external groups trained on per round."),
    rounds: int = typer.Option(80, min=1, help="Rounds per node."),
    regime: str = typer.Option(
        "sparse", help="Tiny model warm start: sparse (learns visibly) or dense."
    ),
    model: str = typer.Option(
        "tiny",
        help="'tiny' (the project's CPU model), a packaged real model (smollm2-135m, "
        "gemma3-270m), a model directory or a hub id.",
    ),
    questions: int | None = typer.Option(
        None, min=1, help="Questions per round (B); default 8 for tiny, 4 for a real model."
    ),
    completions: int | None = typer.Option(
        None, min=2, help="Completions per question (L); default 8 for tiny, 4 for a real model."
    ),
    max_new_tokens: int | None = typer.Option(
        None, min=1, help="Longest completion in tokens; default 16 for tiny, 32 for a real model."
    ),
    seed: int = typer.Option(0, help="Swarm seed (questions and sampling derive from it)."),
    name: str = typer.Option("local", help="Swarm name."),
    nats_url: str | None = typer.Option(None, help="NATS URL (default: embedded server)."),
    ledger: bool = typer.Option(True, help="Record commitments on the embedded EVM."),
    log_dir: Path = typer.Option(Path("runs/swarm"), help="Per-node JSONL logs go here."),
    threads: int = typer.Option(2, min=1, help="Worker threads for generation and training."),
    explorer: bool = typer.Option(
        False, "--explorer", help="Serve the contribution explorer while the swarm runs."
    ),
    explorer_port: int = typer.Option(8787, min=0, max=65535, help="The explorer's port."),
) -> None:
    """Run a local swarm of NODES nodes sharing rollouts, with a live progress display."""
    import anyio

    from sapo_async.ops.config_sections import NatsSection, NodeSection

    # the same rules as node.toml's settings of the same meaning, before anything starts
    require_setting("--name", NodeSection, "swarm", name)
    require(regime in ("sparse", "dense"), "--regime", regime, "sparse or dense")
    if nats_url is not None:
        require_setting("--nats-url", NatsSection, "urls", nats_url)
    require_writable("--log-dir", log_dir, directory=True)

    from sapo_async.logs import configure_logging

    configure_logging(level="WARNING")
    log_dir.mkdir(parents=True, exist_ok=True)
    summary = anyio.run(
        _run_swarm,
        {
            "nodes": nodes,
            "local": local,
            "external": external,
            "rounds": rounds,
            "regime": regime,
            "model": model,
            "sizes": _sizes(model, questions, completions, max_new_tokens),
            "seed": seed,
            "name": name,
            "nats_url": nats_url,
            "ledger": ledger,
            "log_dir": log_dir,
            "threads": threads,
            "explorer": explorer,
            "explorer_port": explorer_port,
        },
    )
    first, last = summary["first"], summary["last"]
    typer.echo(
        f"swarm reward (mean of first/last {summary['window']} rounds): {first:.3f} -> {last:.3f}"
        f"  ({summary['seconds']:.0f} s; logs in {log_dir})"
    )


async def _run_swarm(opts: dict[str, Any]) -> dict[str, Any]:
    import math
    import time

    import anyio
    import torch
    from rich.console import Console
    from rich.table import Table

    from sapo_async.node.embedded import embedded_ledger
    from sapo_async.node.lifecycle import Node
    from sapo_async.node.report import RoundReport, drop_rates
    from sapo_async.node.runner import run_swarm
    from sapo_async.node.spec import NodeSpec
    from sapo_async.ops.status import live_table, print_unclipped

    torch.set_num_threads(1)
    import sys

    # Off a terminal rich assumes 80 columns, too narrow for full addresses in the audit.
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
    log_dir: Path = opts["log_dir"]
    limiter = anyio.CapacityLimiter(opts["threads"])
    t0 = time.perf_counter()
    what = (
        f"the tiny model, {opts['regime']} regime"
        if opts["model"] == "tiny"
        else f"model {opts['model']}"
    )
    sizes = opts["sizes"]
    console.print(
        f"[bold]sapo-async swarm[/]: {opts['nodes']} nodes, "
        f"I/J = {opts['local']}/{opts['external']}, {opts['rounds']} rounds, {what}, "
        f"{sizes.get('questions_per_round', 8)} questions x "
        f"{sizes.get('completions_per_question', 8)} completions x "
        f"{sizes.get('max_new_tokens', 16)} tokens"
    )
    with console.status(f"preparing {what} (built or dequantised once, then cached)"):
        await anyio.to_thread.run_sync(_prepare, opts["model"], opts["regime"])
    latest: dict[str, RoundReport] = {}
    history: list[list[float]] = []
    common = NodeSpec.build(
        swarm=opts["name"],
        regime=opts["regime"],
        model=opts["model"],
        **opts["sizes"],
        local=opts["local"],
        external=opts["external"],
        rounds=opts["rounds"],
        seed=opts["seed"],
        urls=opts["nats_url"] or (),
        ledger_enabled=opts["ledger"],
        limiter=limiter,
    )
    specs = [common.replace(name=f"node{i}", node_index=i) for i in range(opts["nodes"])]
    shown: list[Any] = []  # the live display, once it is up

    def reported(node: Node, report: RoundReport) -> None:
        latest[node.name] = report
        if shown:
            shown[0].update(table())

    def table() -> Table:
        t = Table(title=f"swarm {opts['name']!r}  ({time.perf_counter() - t0:.0f} s)")
        for col in (
            "node",
            "address",
            "round",
            "reward",
            "shared",
            "ext used",
            "rejected",
            "commits ok/pending",
        ):
            t.add_column(col, justify="right")
        for n in run.nodes:
            r = latest.get(n.name)
            if r is None:
                t.add_row(n.name, n.address[:10], "-", "-", "-", "-", "-", "-")
                continue
            t.add_row(
                n.name,
                n.address[:10],
                str(r.round),
                f"{_mean(n, 10):.3f}",
                str(r.groups_shared),
                str(r.external_total),
                str(n.collector.statistics().rejected_total),
                f"{r.commitments_confirmed}/{r.commitments_pending}",
            )
        return t

    async with run_swarm(specs, log_dir=log_dir, on_report=reported) as run:
        async with _explorer(opts, console):
            with live_table(table(), console=console) as live:
                shown.append(live)
                await run.wait_settled(math.inf)  # the rounds take as long as they take
        history.extend([r.reward_mean for r in n.reports] for n in run.nodes)
        stats = [n.collector.statistics() for n in run.nodes]
        print_unclipped(console, _drops_table(drop_rates((s.accepted, s.dropped) for s in stats)))
        handle = embedded_ledger(opts["name"]) if opts["ledger"] else None
        if handle is not None:
            from sapo_async.ledger.audit import audit_swarm, swarm_table

            print_unclipped(console, swarm_table(await audit_swarm(handle.ledger, breakdown=False)))
            console.print(_landing_summary(run.nodes))
    window = max(1, min(10, opts["rounds"] // 3))
    rounds = min(len(h) for h in history) if history else 0
    first = sum(sum(h[:window]) for h in history) / max(1, window * len(history))
    last = sum(sum(h[rounds - window : rounds]) for h in history) / max(1, window * len(history))
    return {"first": first, "last": last, "window": window, "seconds": time.perf_counter() - t0}


def _landing_summary(nodes: Sequence[Any]) -> str:
    """One line: how many commitments landed, how long the last rounds' took, open claims."""
    delays = [n.recorder.landing_delays() for n in nodes if n.recorder is not None]
    stats = [n.recorder.statistics() for n in nodes if n.recorder is not None]
    every = [d for per_node in delays for d in per_node.values()]
    last = [per_node[max(per_node)] for per_node in delays if per_node]
    if not every:
        return "commitments: none landed"
    return (
        f"commitments: {len(every)} landed, {sum(s.pending for s in stats)} pending, "
        f"{sum(s.failed for s in stats)} failed; journal to chain: last round "
        f"{max(last):.1f} s at most, any round {max(every):.1f} s at most; credit claims "
        f"settled {sum(s.claims_settled for s in stats)}, open {sum(s.claims_open for s in stats)}"
    )


@contextlib.asynccontextmanager
async def _explorer(opts: dict[str, Any], console: Any) -> AsyncIterator[None]:
    """Serve the explorer over this swarm while the block runs (``--explorer``)."""
    if not opts["explorer"]:
        yield
        return
    from sapo_async.explorer.demo import serve_embedded

    async with serve_embedded(opts["name"], opts["log_dir"], port=opts["explorer_port"]) as url:
        console.print(f"[bold]explorer[/]: {url}")
        yield


def _sizes(
    model: str, questions: int | None, completions: int | None, max_new_tokens: int | None
) -> dict[str, int]:
    """The round sizes asked for, the rest the model's defaults (the spec's for tiny)."""
    from sapo_async.limits import REAL_MODEL_SIZES

    sizes = {} if model == "tiny" else dict(REAL_MODEL_SIZES)
    asked = {
        "questions_per_round": questions,
        "completions_per_question": completions,
        "max_new_tokens": max_new_tokens,
    }
    sizes.update({k: v for k, v in asked.items() if v is not None})
    return sizes


def _prepare(model: str, regime: str) -> None:
    """Build the tiny model or prepare a packaged one now, once, before the nodes load it."""
    from sapo_async.policy.models import ensure_tiny_model, tiny_spec
    from sapo_async.policy.models.packaged import PACKAGED_MODELS, ensure_packaged_model

    if model == "tiny":
        ensure_tiny_model(tiny_spec(regime))
    elif model in PACKAGED_MODELS:
        ensure_packaged_model(model)


def _drops_table(rates: Any) -> Any:
    """The closing table of the round's checks: every producer here is honest, so each
    drop is a false positive (the rate is per candidate judged)."""
    from rich.table import Table

    t = Table(
        title="honest groups dropped after admission",
        caption=f"false positives per {rates.admitted} admitted",
    )
    for col in ("check", "dropped", "rate"):
        t.add_column(col, justify="right")
    for reason, n in rates.dropped.items():
        t.add_row(reason, str(n), f"{rates.rate(reason):.4f}")
    return t


def _mean(node: Any, k: int) -> float:
    reports = node.reports[-k:]
    return float(sum(r.reward_mean for r in reports) / max(1, len(reports)))


experiment_app = typer.Typer(
    help="Experiments that reproduce the paper's comparisons.", no_args_is_help=True
)


@experiment_app.command("paper-table")
def paper_table(
    regime: str = typer.Option("both", help="sparse, dense, or both (async: sparse)."),
    path: str = typer.Option(
        "lockstep",
        help="lockstep (in-memory transport, a barrier per round, ledger off) or async "
        "(nodes at their own pace over a real nats-server, ledger on, no barrier).",
    ),
    out: Path | None = typer.Option(
        None,
        help="Output directory (default docs/results/paper-table or "
        "docs/results/paper-table-async; with --quick runs/paper-table-quick or "
        "runs/paper-table-async-quick, so a smoke run never writes over recorded results).",
    ),
    seeds: int | None = typer.Option(
        None, min=1, help="Seeds per configuration (default 3; 2 for a real model)."
    ),
    seed_offset: int = typer.Option(
        0, min=0, help="First seed (seeds run offset .. offset + seeds - 1)."
    ),
    rounds: int | None = typer.Option(None, help="Rounds per run (default: the preset's)."),
    arms: str | None = typer.Option(
        None,
        help="async: comma-separated I/J arms run on every seed, optionally +tis or +ftis "
        "(default 8/0,4/4; the first is the baseline).",
    ),
    side_arms: str | None = typer.Option(
        None,
        help="async: arms run on the first seed only ('' for none; default "
        "4/4+tis,4/4+ftis,1/7,0/8).",
    ),
    workers: int = typer.Option(2, min=1, help="Runs in parallel (one process each)."),
    quick: bool = typer.Option(False, "--quick", help="Seconds-long smoke version (tests)."),
    tasks: str | None = typer.Option(
        None,
        help="Task preset (cpu: chain_sum; cpu_mix: three families; real_mix: the real "
        "model's three). Default: cpu on the lockstep path, the preset's on the async path "
        "(tiny: cpu_mix; a real model: real_mix).",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="async: keep the runs already in the output's JSON (same settings)."
    ),
    model: str = typer.Option(
        "tiny",
        help="async: tiny, or a packaged real model (smollm2-135m) with its own preset "
        "(4 nodes, 4/0 vs 2/2, B=4 x L=4, 32 tokens, last 4 blocks train; "
        "docs/results/paper-table-real).",
    ),
    start_rounds: int = typer.Option(
        0,
        min=0,
        help="async with a real model: first measure its start per family and a lone "
        "node's curve of this many rounds (start.json), then the table.",
    ),
) -> None:
    """Run the I/J configurations with common random numbers; write table, figures, JSON."""
    from sapo_async.logs import configure_logging

    configure_logging(level="WARNING")
    default_seeds = 2 if model != "tiny" else 3
    seed_list = tuple(range(seed_offset, seed_offset + (seeds or default_seeds)))
    if path == "async":
        _paper_table_async(
            regime,
            out,
            seed_list,
            rounds,
            (arms, side_arms),
            workers,
            (quick, resume),
            (model, start_rounds, tasks),
        )
        return
    if model != "tiny":
        raise typer.BadParameter(f"--model {model!r} needs --path async (lockstep runs tiny)")
    if path != "lockstep":
        raise typer.BadParameter(f"path must be lockstep or async, got {path!r}")
    from dataclasses import replace

    from sapo_async.experiment import paper_table as pt

    if out is None:
        out = Path("runs/paper-table-quick" if quick else "docs/results/paper-table")
    regimes = ["sparse", "dense"] if regime == "both" else [regime]
    for name in regimes:
        if name not in pt.PRESETS:
            raise typer.BadParameter(f"regime must be sparse, dense or both, got {name!r}")
        spec = pt.PRESETS[name]
        spec = replace(spec, seeds=seed_list, tasks=tasks or "cpu")
        if rounds is not None:
            spec = replace(spec, rounds=rounds)
        if arms is not None:  # plain I/J configurations on the lockstep path
            spec = replace(spec, configs=tuple(_plain_arms(arms)))
        if quick:
            spec = pt.quick(spec)

        def progress(res: pt.RunResult, regime: str = name) -> None:
            cum = sum(sum(n) for n in res.rewards)
            typer.echo(
                f"  {regime} {res.config} seed {res.seed}: cumulative {cum:.2f} "
                f"({res.seconds:.0f} s)"
            )

        typer.echo(f"{name}: {len(spec.configs) * len(spec.seeds)} runs of {spec.rounds} rounds")
        pt.run_experiment(spec, out, workers=1 if quick else workers, on_result=progress)
        typer.echo((out / f"{name}.md").read_text())


def _plain_arms(arms: str) -> list[tuple[int, int]]:
    from sapo_async.errors import ConfigError
    from sapo_async.experiment.paper_table_async import parse_arm

    out = []
    for arm in (a.strip() for a in arms.split(",") if a.strip()):
        try:
            i, j, suffix = parse_arm(arm)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
        if suffix:
            raise typer.BadParameter(f"the lockstep path takes plain I/J arms, got {arm!r}")
        out.append((i, j))
    return out


def _paper_table_async(
    regime: str,
    out: Path | None,
    seed_list: tuple[int, ...],
    rounds: int | None,
    arms: tuple[str | None, str | None],
    workers: int,
    modes: tuple[bool, bool],
    real: tuple[str, int, str | None] = ("tiny", 0, None),
) -> None:
    """``paper-table --path async`` (see :mod:`sapo_async.experiment.paper_table_async`)."""
    from dataclasses import replace

    from sapo_async.errors import ConfigError
    from sapo_async.experiment import paper_table_async as pta
    from sapo_async.policy.models.packaged import packaged_model_names

    quick, resume = modes
    model, start_rounds, tasks = real

    name = "sparse" if regime == "both" else regime
    if name not in pta.ASYNC_PRESETS or name == "smollm2":
        raise typer.BadParameter(f"regime of the async path must be sparse, got {regime!r}")
    if model != "tiny" and model not in packaged_model_names():
        allowed = ", ".join(("tiny", *packaged_model_names()))
        raise typer.BadParameter(f"--model {model!r} is not one of {allowed}")
    spec = pta.ASYNC_PRESETS["smollm2"] if model != "tiny" else pta.ASYNC_PRESETS[name]
    if model != "tiny":
        spec = replace(spec, model=model, name=model.split("-")[0])
    try:
        spec = replace(spec, seeds=seed_list)
        if tasks is not None:
            from sapo_async.tasks.spec import preset

            preset(tasks)  # a bad name is refused here, naming the allowed ones
            spec = replace(spec, tasks=tasks)
        if rounds is not None:
            spec = replace(spec, rounds=rounds)
        main, side = arms
        if quick:
            spec = pta.quick_async(spec)
        if main is not None:
            spec = replace(spec, arms=tuple(a.strip() for a in main.split(",") if a.strip()))
        if side is not None:
            spec = replace(spec, side_arms=tuple(a.strip() for a in side.split(",") if a.strip()))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if out is None:
        kind = "real" if spec.real else "async"
        out = Path(
            f"runs/paper-table-{kind}-quick" if quick else f"docs/results/paper-table-{kind}"
        )

    def progress(res: pta.AsyncRun) -> None:
        cum = sum(sum(n) for n in res.rewards)
        stale = sum(k * v for k, v in res.staleness.items()) / max(1, sum(res.staleness.values()))
        typer.echo(
            f"  {res.config} seed {res.seed}: cumulative {cum:.2f}, external {res.external_used}"
            f" (mean staleness {stale:.2f}), {res.seconds:.0f} s",
            err=True,
        )

    typer.echo(
        f"async {spec.stem}: {len(spec.jobs())} swarms of {spec.nodes} nodes x "
        f"{spec.rounds} rounds, {workers if not quick else 1} at a time",
        err=True,
    )

    def failure(arm: str, seed: int, exc: BaseException) -> None:
        typer.echo(f"  {arm} seed {seed}: FAILED ({exc!r}); the other runs go on", err=True)

    if spec.real and start_rounds:
        from sapo_async.experiment.paper_table_real import run_start

        typer.echo(f"{spec.model}: start per family, then {start_rounds} rounds alone", err=True)
        run_start(spec, out, single_rounds=start_rounds)
    pta.run_async_experiment(
        spec,
        out,
        workers=1 if quick else workers,
        on_result=progress,
        on_failure=failure,
        resume=resume,
    )
    if spec.real:
        from sapo_async.experiment.paper_table_real import write_real_summary

        write_real_summary(spec, out)
    typer.echo((out / f"{spec.stem}.md").read_text())


def register(app: typer.Typer) -> None:
    """Add ``swarm`` and ``experiment`` to the command line."""
    from sapo_async.cli.attack import attack

    app.command("swarm")(swarm)
    experiment_app.command("attack")(attack)
    app.add_typer(experiment_app, name="experiment")
