"""``sapo-async experiment paper-table``: the paper's I/J comparison, on the lockstep
harness or the product's async path, with the tiny model or a packaged real one.

Owns argument parsing; the runs are :mod:`sapo_async.experiment`'s.
"""

# B008/PLR0917: typer's declarative options (one parameter per option).
# ruff: noqa: B008, PLR0917

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["experiment_app", "paper_table"]

_OPTIONS = {
    "model": "--model",
    "nodes": "--nodes",
    "arms": "--arms",
    "eval_questions": "--eval-questions",
    "eval_completions": "--eval-completions",
}
"""The async spec's fields by the option that sets them (an error names the option)."""


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
        help="Output directory (default docs/results/paper-table, or on the async path "
        "docs/results/paper-table-async, -real with a real model or -mixed with two; with "
        "--quick runs/paper-table-quick or runs/paper-table-async-quick, -real-quick, "
        "-mixed-quick, so a smoke run never writes over recorded results).",
    ),
    seeds: int | None = typer.Option(
        None, min=1, help="Seeds per configuration (default 3; 2 for a real model)."
    ),
    seed_offset: int = typer.Option(
        0, min=0, help="First seed (seeds run offset .. offset + seeds - 1)."
    ),
    rounds: int | None = typer.Option(None, help="Rounds per run (default: the preset's)."),
    nodes: int | None = typer.Option(
        None,
        min=2,
        help="Nodes per swarm (default: the preset's, 8 for the tiny and the SmolLM2 presets; "
        "the output's JSON records it, so --resume only keeps runs of the same size).",
    ),
    arms: str | None = typer.Option(
        None,
        help="async: comma-separated I/J arms run on every seed, optionally +tis, +ftis or "
        "+fresh, then optionally -off: every node's defences off ([defence] active = false), "
        "recorded as its own arm, e.g. 2/2-off (default 8/0,4/4; the first is the baseline).",
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
        help="Task preset (cpu: chain_sum; cpu_mix: three families; real_mix, real_sparse: "
        "the real model's). Default: cpu on the lockstep path, the preset's on the async path "
        "(tiny: cpu_mix; a real model: real_sparse).",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="async: keep the runs already in the output's JSON (same settings)."
    ),
    model: str = typer.Option(
        "tiny",
        help="async: tiny, or a packaged real model (smollm2-135m) with its own preset "
        "(8 nodes, 4/0 vs 2/2, B=4 x L=4, 32 tokens, last 4 blocks train; "
        "docs/results/paper-table-real), or two packaged models joined by + "
        "(smollm2-135m+gemma3-270m: the same sizes, nodes alternate models, arms "
        "4/0,2/2,2/2+ftis; the table reports each model alone and shared; "
        "docs/results/paper-table-mixed).",
    ),
    start_rounds: int = typer.Option(
        0,
        min=0,
        help="async with a real model: first measure its start per family and a lone "
        "node's curve of this many rounds (start.json), then the table.",
    ),
    eval_questions: int = typer.Option(
        0,
        min=0,
        help="async: after each swarm every node answers this many held-out questions of "
        "its families (never trained on; the same for every arm of a seed); the table "
        "reports their ratio to the baseline beside the training reward's (default 0: none).",
    ),
    eval_completions: int = typer.Option(
        8, min=1, help="async: answers sampled per held-out question."
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
            (rounds, nodes),
            (arms, side_arms),
            workers,
            (quick, resume),
            (model, start_rounds, tasks),
            (eval_questions, eval_completions),
        )
        return
    if eval_questions:
        raise typer.BadParameter(
            "--eval-questions needs --path async (the lockstep path evaluates none)",
            param_hint="'--eval-questions'",
        )
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
        if nodes is not None:
            spec = replace(spec, nodes=nodes)
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
    from sapo_async.experiment.paper_table_async_spec import defended_arm, parse_arm

    out = []
    for arm in (a.strip() for a in arms.split(",") if a.strip()):
        try:
            i, j, suffix = parse_arm(arm)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
        if suffix or defended_arm(arm) != arm:
            raise typer.BadParameter(f"the lockstep path takes plain I/J arms, got {arm!r}")
        out.append((i, j))
    return out


def _paper_table_async(
    regime: str,
    out: Path | None,
    seed_list: tuple[int, ...],
    sizes: tuple[int | None, int | None],
    arms: tuple[str | None, str | None],
    workers: int,
    modes: tuple[bool, bool],
    real: tuple[str, int, str | None] = ("tiny", 0, None),
    evals: tuple[int, int] = (0, 8),
) -> None:
    """``paper-table --path async`` (see :mod:`sapo_async.experiment.paper_table_async`)."""
    from dataclasses import replace

    from sapo_async.errors import ConfigError
    from sapo_async.experiment import paper_table_async as pta
    from sapo_async.experiment.paper_table_async_spec import MODEL_JOIN
    from sapo_async.policy.models.packaged import packaged_model_names

    quick, resume = modes
    model, start_rounds, tasks = real
    rounds, nodes = sizes

    name = "sparse" if regime == "both" else regime
    if name not in pta.ASYNC_PRESETS or name in ("smollm2", "mixed"):
        raise typer.BadParameter(f"regime of the async path must be sparse, got {regime!r}")
    if model != "tiny" and MODEL_JOIN not in model and model not in packaged_model_names():
        allowed = ", ".join(("tiny", *packaged_model_names()))
        raise typer.BadParameter(
            f"--model {model!r} is not one of {allowed}, or two packaged models joined by "
            f"{MODEL_JOIN!r}"
        )
    chosen = "mixed" if MODEL_JOIN in model else "smollm2" if model != "tiny" else name
    spec = pta.ASYNC_PRESETS[chosen]
    try:
        if model != "tiny":  # a mixed swarm's stem names both: smollm2-gemma3
            stem = "-".join(m.split("-")[0] for m in model.split(MODEL_JOIN))
            spec = replace(spec, model=model, name=stem)
        spec = replace(spec, seeds=seed_list)
        if tasks is not None:
            from sapo_async.tasks.spec import preset

            preset(tasks)  # a bad name is refused here, naming the allowed ones
            spec = replace(spec, tasks=tasks)
        if rounds is not None:
            spec = replace(spec, rounds=rounds)
        if nodes is not None:
            spec = replace(spec, nodes=nodes)
        main, side = arms
        if quick:
            spec = pta.quick_async(spec)
        if main is not None:
            spec = replace(spec, arms=tuple(a.strip() for a in main.split(",") if a.strip()))
        if side is not None:
            spec = replace(spec, side_arms=tuple(a.strip() for a in side.split(",") if a.strip()))
        spec = replace(spec, eval_questions=evals[0], eval_completions=evals[1])
    except ConfigError as exc:
        option = _OPTIONS.get(exc.field or "")
        raise typer.BadParameter(
            str(exc).splitlines()[0], param_hint=f"'{option}'" if option else None
        ) from None
    if out is None:
        kind = "mixed" if spec.mixed else "real" if spec.real else "async"
        out = Path(
            f"runs/paper-table-{kind}-quick" if quick else f"docs/results/paper-table-{kind}"
        )

    def progress(res: pta.AsyncRun) -> None:
        cum = sum(sum(n) for n in res.rewards)
        stale = sum(k * v for k, v in res.staleness.items()) / max(1, sum(res.staleness.values()))
        held = (
            f", held-out {sum(res.eval_rewards) / len(res.eval_rewards):.3f} ({res.eval_s:.0f} s)"
            if res.eval_rewards
            else ""
        )
        typer.echo(
            f"  {res.config} seed {res.seed}: cumulative {cum:.2f}, external {res.external_used}"
            f" (mean staleness {stale:.2f}), {res.seconds:.0f} s{held}",
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
