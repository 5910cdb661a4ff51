"""``sapo-async swarm`` (a local swarm, the README's main job); registers the
``experiment`` commands (:mod:`.paper_table`, :mod:`.attack`).

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
            from sapo_async.cli.audit import swarm_table
            from sapo_async.ledger.audit import audit_swarm

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


def register(app: typer.Typer) -> None:
    """Add ``swarm`` and ``experiment`` to the command line."""
    from sapo_async.cli.attack import attack
    from sapo_async.cli.paper_table import experiment_app

    app.command("swarm")(swarm)
    experiment_app.command("attack")(attack)
    app.add_typer(experiment_app, name="experiment")
