"""``sapo-async experiment attack``: the attack matrix, defences off and on (docs/security.md).

Every node runs a node's own defences: the experiment's
:attr:`~sapo_async.experiment.attack.spec.AttackSpec.defence` is ``DefenceSpec()`` unless
``--defence KEY=VALUE`` (repeatable) changes a setting, ``KEY`` a key of node.toml's
``[defence]`` and the value checked by the spec as node.toml's is
(:func:`~sapo_async.experiment.attack.spec.defence_of`). One generic option rather than a
typer option per setting: the keys are the spec's own names (no ``--no-x`` spellings
renamed on the way), a setting the node spec gains or drops needs no change here, an
unknown key is refused naming the allowed ones, and the module keeps importing the
harness only when the command runs, so ``--help`` stays light.
"""

# ruff: noqa: B008, PLR0917
# (typer declares options as call defaults, one parameter per option, as cli/swarm.py does.)
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from sapo_async.node.spec_defence import DefenceSpec

__all__ = ["attack"]

_ATTACKS = (
    "all: inject, tokens, length, flood, absurd, wrong, filler; by name only: trigger, "
    "stock_leads, longest, capped, post_selected, sybil and the held-out trigger_nonsense, "
    "false_step, sleeper, diluted (run once the defaults are settled, reported apart)"
)
"""The attacks ``--attacks`` takes (spec.py's ATTACKS, LITERATURE_ATTACKS and
HELD_OUT_ATTACKS, written out so that ``--help`` imports no harness)."""


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
    "max_new_tokens": "--max-new-tokens",
    "questions_per_round": "--questions",
    "completions_per_question": "--completions",
    "eval_questions": "--eval-questions",
    "eval_completions": "--eval-completions",
}
"""The spec's fields by the option that sets them (an error names the option)."""


def attack(
    attacks: str = typer.Option("all", help=f"Comma-separated attacks, or all ({_ATTACKS})."),
    out: Path | None = typer.Option(
        None,
        help="Output directory (default docs/results/attack-defaults for the tiny model, "
        "docs/results/attack-real-defaults for a packaged one, each changed --defence "
        "setting named instead of -defaults; with --quick under runs/, so a smoke run never "
        "writes over recorded results).",
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
    defence: list[str] | None = typer.Option(
        None,
        "--defence",
        metavar="KEY=VALUE",
        help="Change one of every node's defence settings from a node's default, named by "
        "its key in node.toml's \\[defence] (e.g. stock_lead_share=0); repeatable. Without "
        "it every node runs a node's defaults. The default output directory names each "
        "change.",
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
        help="Run only what an attack costs a defended node: each attack with the defences "
        "on, and no attack with the defences on and off and B/0 (the sharing gain).",
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
    from sapo_async.experiment.attack.spec import defence_of
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
            defence=defence_of(defence or ()),
        )
        if quick:
            spec = runner.quick(spec)
        spec = replace(spec, **{k: v for k, v in given.items() if v is not None})
    except ConfigError as exc:
        field = exc.field or ""
        option = "--defence" if field.split(".")[0] == "defence" else _OPTIONS.get(field, field)
        message = str(exc).splitlines()[0]
        raise typer.BadParameter(message, param_hint=f"'{option}'") from None
    if out is None:
        # Never resume a record of other settings by default: docs/results/attack and
        # attack-real were recorded before a node's defaults were what they are.
        changes = _changes(spec.defence)
        name = ("attack-real" if spec.real else "attack") + changes
        if quick:
            out = Path(f"runs/{name}-quick")
        else:  # a record holds what ran: a node's defaults get a folder of their own
            out = Path(f"docs/results/{name}{'' if changes else '-defaults'}")

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


def _changes(defence: DefenceSpec) -> str:
    """``-<key>-<value>`` for each setting of ``defence`` that is not a node's default."""
    import json

    from sapo_async.node.spec_defence import DefenceSpec

    node = DefenceSpec().model_dump(mode="json")
    mine = defence.model_dump(mode="json")
    return "".join(f"-{k}-{json.dumps(v)}" for k, v in mine.items() if v != node[k])
