"""``sapo-async experiment attack``: the attack matrix, defences off and on (docs/security.md).

Imports the harness only when the command runs, so ``--help`` stays light.
"""

# ruff: noqa: B008, PLR0917
# (typer declares options as call defaults, one parameter per option, as cli/swarm.py does.)
from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["attack"]

_ATTACKS = "inject, tokens, length, flood, absurd, wrong"


def attack(
    attacks: str = typer.Option("all", help=f"Comma-separated attacks ({_ATTACKS}) or all."),
    out: Path | None = typer.Option(
        None,
        help="Output directory (default docs/results/attack; with --quick "
        "runs/attack-quick, so a smoke run never writes over recorded results).",
    ),
    seeds: int = typer.Option(2, min=1, help="Seeds per cell."),
    rounds: int | None = typer.Option(None, min=1, help="Rounds per run (default 12)."),
    attackers: int = typer.Option(2, min=1, help="Attacking nodes of the 8."),
    workers: int = typer.Option(4, min=1, help="Runs in parallel (one process each)."),
    quick: bool = typer.Option(False, "--quick", help="Seconds-long smoke version (tests)."),
) -> None:
    """Run every attack with defences off and on, the no-attack runs and 8/0; write
    summary.json, runs.json and attack.png."""
    from dataclasses import replace

    from sapo_async.experiment.attack import runner
    from sapo_async.logs import configure_logging

    configure_logging(level="WARNING")
    names = runner.ATTACKS if attacks == "all" else tuple(a.strip() for a in attacks.split(","))
    unknown = [a for a in names if a not in runner.ATTACKS]
    if unknown:
        raise typer.BadParameter(f"unknown attack {unknown[0]!r}; allowed: {_ATTACKS}")
    spec = replace(
        runner.AttackSpec(), attacks=names, seeds=tuple(range(seeds)), attackers=attackers
    )
    if rounds is not None:
        spec = replace(spec, rounds=rounds)
    if quick:
        spec = runner.quick(spec)
    if out is None:
        out = Path("runs/attack-quick" if quick else "docs/results/attack")

    def progress(m: runner.RunMeasure) -> None:
        state = "on" if m.defences else "off"
        typer.echo(f"  {m.attack} defences {state} seed {m.seed} {m.config}: {m.seconds:.0f} s")

    jobs = runner.jobs_of(spec)
    typer.echo(f"{len(jobs)} runs of {spec.rounds} rounds -> {out}")
    runner.run_matrix(spec, out, workers=1 if quick else workers, on_result=progress)
    typer.echo((out / "summary.md").read_text())
