"""``sapo-async experiment attack``: the attack matrix, defences off and on (docs/security.md).

Imports the harness only when the command runs, so ``--help`` stays light.
"""

# ruff: noqa: B008, PLR0917
# (typer declares options as call defaults, one parameter per option, as cli/swarm.py does.)
from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

__all__ = ["attack"]

_ATTACKS = "inject, tokens, length, flood, absurd, wrong, filler"


_OPTIONS = {
    "attacks": "--attacks",
    "model": "--model",
    "train_layers": "--train-layers",
    "tasks": "--tasks",
    "transport": "--transport",
    "nodes": "--nodes",
    "attackers": "--attackers",
    "rounds": "--rounds",
    "lr": "--lr",
    "tail_share": "--tail-share",
    "stock_lead_share": "--stock-lead-share",
    "lead_probation": "--lead-probation",
    "max_new_tokens": "--max-new-tokens",
    "questions_per_round": "--questions",
    "completions_per_question": "--completions",
    "eval_questions": "--eval-questions",
    "eval_completions": "--eval-completions",
}
"""The spec's fields by the option that sets them (an error names the option)."""


def attack(
    attacks: str = typer.Option("all", help=f"Comma-separated attacks ({_ATTACKS}) or all."),
    out: Path | None = typer.Option(
        None,
        help="Output directory (default docs/results/attack for the tiny model, "
        "docs/results/attack-real for a packaged one; with --quick under runs/, so a smoke "
        "run never writes over recorded results).",
    ),
    model: str = typer.Option(
        "tiny", help="'tiny' (the 0.86 M character model) or a packaged model (smollm2-135m)."
    ),
    train_layers: int | None = typer.Option(
        None, help="Train only the last N transformer blocks (default: every parameter)."
    ),
    tasks: str | None = typer.Option(
        None,
        help="A task preset (cpu, cpu_easy, cpu_mix, paper) or comma-separated reasoning-gym "
        "families (default: cpu for tiny, cpu_easy for a packaged model).",
    ),
    transport: str = typer.Option(
        "nats", help="'nats' (a private nats-server with JetStream per run) or 'memory'."
    ),
    seeds: int = typer.Option(2, min=1, help="Seeds per cell."),
    rounds: int | None = typer.Option(None, help="Rounds per run (default 12)."),
    nodes: int | None = typer.Option(None, help="Swarm size (default 8)."),
    attackers: int | None = typer.Option(None, help="Attacking nodes (default 2)."),
    questions: int | None = typer.Option(None, help="Questions per round, B (default 4)."),
    completions: int | None = typer.Option(None, help="Completions per question, L (default 8)."),
    local: int | None = typer.Option(None, help="Own groups trained per round, I (default 2)."),
    external: int | None = typer.Option(
        None, help="External groups trained per round, J (default 2)."
    ),
    lr: float | None = typer.Option(None, help="AdamW learning rate (default 3e-4)."),
    max_new_tokens: int | None = typer.Option(None, help="Completion cap (default 16)."),
    strict_end: bool = typer.Option(
        False,
        "--strict-end",
        help="With the defences on, text after the closing answer tag scores 0 "
        "([defence] answer_ends_completion); default output directory gets -strict.",
    ),
    cut_after_answer: bool = typer.Option(
        False,
        "--cut-after-answer/--no-cut-after-answer",
        help="With the defences on, peers' completions are screened and trained only "
        "through their closing answer tag ([defence] cut_after_answer, on in a node by "
        "default; off here so recorded matrices resume, on in `just attack-real`); default "
        "output directory gets -cut.",
    ),
    drop_after_answer: bool = typer.Option(
        False,
        "--drop-after-answer",
        help="With the defences on, peers' completions with text after their closing answer "
        "tag are left out of training ([defence] drop_after_answer); default output "
        "directory gets -drop.",
    ),
    tail_share: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="With the defences on, do as --drop-after-answer for a producer once this share "
        "of its rewarded answers carried a tail ([defence] tail_share, off by default); "
        "default output directory gets -tails.",
    ),
    stock_lead_share: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="With the defences on, leave out a producer's completions showing its stock "
        "lead, the same words before this share of its rewarded answers ([defence] "
        "stock_lead_share, 0.5 in a node by default; `just attack-real` passes it); "
        "default output directory gets -leads.",
    ),
    lead_probation: bool = typer.Option(
        False,
        "--lead-probation/--no-lead-probation",
        help="With --stock-lead-share, train no group of a producer until the record can "
        "judge it ([defence] stock_lead_probation, on in a node by default; `just "
        "attack-real` passes it); output gets -probation.",
    ),
    balanced_draw: bool = typer.Option(
        False,
        "--balanced-draw",
        help="With the defences on, draw peers' groups least served producer first "
        "([defence] balanced_draw, off by default); default output directory gets -balanced.",
    ),
    brevity_guard: bool = typer.Option(
        False,
        "--brevity-guard/--no-brevity-guard",
        help="With the defences on, drop groups whose rewarded answers show far less text "
        "before the answer than the node's own ([defence] brevity_guard, on in a node by "
        "default; `just attack-real` passes it); default output directory gets -brevity.",
    ),
    eval_questions: int | None = typer.Option(
        None,
        help="After the last round each honest node answers this many held-out questions "
        "(the same for every run; default 0: none); the summary's held_out section compares "
        "those rewards.",
    ),
    eval_completions: int | None = typer.Option(
        None, help="Answers sampled per held-out question (default 8)."
    ),
    defended_only: bool = typer.Option(
        False,
        "--defended-only",
        help="Run only what an attack costs a defended node: no attack and each attack, "
        "the defences on.",
    ),
    workers: int = typer.Option(4, min=1, help="Runs in parallel (one process each)."),
    quick: bool = typer.Option(
        False, "--quick", help="Seconds-long smoke version (tests); options given still apply."
    ),
    recorded: bool = typer.Option(
        False,
        "--recorded",
        help="Run nothing: summarise the runs recorded in --out with these sizes, each cell "
        "over the seeds whose runs are all there.",
    ),
) -> None:
    """Run every attack with defences off and on, the no-attack runs and 8/0; write
    summary.json, runs.json and attack.png."""
    from dataclasses import replace

    from sapo_async.errors import ConfigError
    from sapo_async.experiment.attack import runner
    from sapo_async.logs import configure_logging
    from sapo_async.tasks.spec import PRESETS, FamilySpec

    configure_logging(level="WARNING")
    names = runner.ATTACKS if attacks == "all" else tuple(a.strip() for a in attacks.split(","))
    task_setting: str | tuple[FamilySpec, ...] | None = tasks
    if tasks is not None and tasks not in PRESETS:
        task_setting = tuple(FamilySpec(f.strip()) for f in tasks.split(",") if f.strip())
    given: dict[str, Any] = {
        "rounds": rounds,
        "nodes": nodes,
        "attackers": attackers,
        "questions_per_round": questions,
        "completions_per_question": completions,
        "local": local,
        "external": external,
        "lr": lr,
        "max_new_tokens": max_new_tokens,
        "eval_questions": eval_questions,
        "eval_completions": eval_completions,
    }
    try:
        spec = replace(
            runner.AttackSpec(),
            attacks=names,
            seeds=tuple(range(seeds)),
            model=model,
            train_layers=train_layers,
            tasks=task_setting,
            transport=transport,
            strict_end=strict_end,
            cut_after_answer=cut_after_answer,
            drop_after_answer=drop_after_answer,
            tail_share=tail_share,
            stock_lead_share=stock_lead_share,
            lead_probation=lead_probation,
            balanced_draw=balanced_draw,
            brevity_guard=brevity_guard,
        )
        if quick:
            spec = runner.quick(spec)
        spec = replace(spec, **{k: v for k, v in given.items() if v is not None})
    except ConfigError as exc:
        option = _OPTIONS.get(exc.field or "", exc.field or "")
        message = str(exc).splitlines()[0]
        raise typer.BadParameter(message, param_hint=f"'{option}'") from None
    if out is None:
        name = ("attack-real" if spec.real else "attack") + ("-strict" if strict_end else "")
        name += "-cut" if cut_after_answer else ""
        name += "-drop" if drop_after_answer else ""
        name += "-tails" if tail_share else ""
        name += "-leads" if stock_lead_share else ""
        name += "-probation" if lead_probation else ""
        name += "-balanced" if balanced_draw else ""
        name += "-brevity" if brevity_guard else ""
        out = Path(f"runs/{name}-quick" if quick else f"docs/results/{name}")

    def progress(m: runner.RunMeasure) -> None:
        state = "on" if m.defences else "off"
        typer.echo(f"  {m.attack} defences {state} seed {m.seed} {m.config}: {m.seconds:.0f} s")

    if recorded:
        typer.echo(f"summarising the runs recorded in {out}")
    else:
        count = len(runner.jobs_of(spec, defended_only=defended_only))
        typer.echo(f"{count} runs of {spec.rounds} rounds -> {out}")
    runner.run_matrix(
        spec,
        out,
        workers=1 if quick else workers,
        on_result=progress,
        recorded=recorded,
        defended_only=defended_only,
    )
    typer.echo((out / "summary.md").read_text())
