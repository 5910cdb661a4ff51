"""``sapo-async train`` (one node alone, J = 0) and ``sapo-async warmstart``.

Owns only argument parsing, progress display and the JSONL log (one
:class:`~sapo_async.node.report.RoundReport` a line); the work is in
:mod:`sapo_async.node.alone` (the lone node on the in-memory fabric),
:mod:`sapo_async.policy.models` and :mod:`sapo_async.node.checkpoint`.
Heavy imports happen inside the commands so ``--help`` stays fast; so the flags that a node's
spec also has take their defaults from :mod:`sapo_async.limits` (the spec's own source,
free of torch and pydantic), never from literals of their own.
"""

# PLC0415: lazy imports keep `--help` fast (cli/main.py's rule); B008/PLR0917: typer's
# declarative options are function defaults by design.
# ruff: noqa: B008, PLR0917

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from sapo_async.cli.boundary import require, require_writable
from sapo_async.limits import (
    DEFAULT_COMPLETIONS_PER_QUESTION,
    DEFAULT_LOSS_TYPE,
    DEFAULT_LR,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_QUESTIONS_PER_ROUND,
    DEFAULT_SWARM_SEED,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    MAX_QUESTIONS_PER_ROUND,
    MAX_ROLLOUTS_PER_ROUND,
)

__all__ = ["register"]


def _setup(threads: int, log_level: str) -> None:
    # before the learning modules are imported, so their loggers see the configuration
    from sapo_async.logs import configure_logging

    configure_logging(level=log_level)
    import torch

    torch.set_num_threads(threads)


def warmstart(
    regime: str = typer.Option("all", help="sparse, dense, or all."),
    cache_dir: Path | None = typer.Option(
        None, help="Cache root (default $SAPO_CACHE_DIR or ~/.cache/sapo_async)."
    ),
    seed: int = typer.Option(0, help="Seed of tokenizer sample, init, data order."),
    threads: int = typer.Option(2, help="torch CPU threads."),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING, ..."),
    models: str = typer.Option(
        "",
        help="Also prepare these packaged real models (comma-separated: smollm2-135m, "
        "gemma3-270m): check the sha256 and dequantise once into the cache.",
    ),
    verify_models: bool = typer.Option(
        False,
        "--verify-models",
        help="With --models: check every byte of an already prepared model against the "
        "sha256 recorded when it was prepared (a damaged one is moved aside and prepared "
        "again).",
    ),
) -> None:
    """Build (or find cached) the tiny model(s) and print their warm-start rewards."""
    _check_common(threads, log_level)
    require(regime in ("sparse", "dense", "all"), "--regime", regime, "sparse, dense or all")
    require(seed >= 0, "--seed", seed, ">= 0")
    from sapo_async.policy.models.packaged import PACKAGED_MODELS, ensure_packaged_model

    wanted = [m.strip() for m in models.split(",") if m.strip()]
    for name in wanted:
        require(name in PACKAGED_MODELS, "--models", name, ", ".join(sorted(PACKAGED_MODELS)))
    _setup(threads, log_level)
    for name in wanted:
        typer.echo(f"{name}: {ensure_packaged_model(name, cache_dir, verify=verify_models)}")
    from sapo_async.policy.models import REGIMES, ensure_tiny_model, read_report, tiny_spec

    names = sorted(REGIMES) if regime == "all" else [regime]
    for name in names:
        spec = tiny_spec(name, seed=seed)
        path = ensure_tiny_model(spec, cache_dir)
        rep = read_report(path)
        typer.echo(
            f"{name}: {path}  reward {rep.reward_before:.3f} -> {rep.reward_after:.3f}  "
            f"tag rate {rep.tag_rate_after:.3f}  ({rep.steps} steps, {rep.seconds:.0f} s, "
            f"{rep.params} params)"
        )


def train(
    rounds: int = typer.Option(100, help="Rounds to run."),
    model: str = typer.Option("tiny", help="'tiny' or a local model directory / hub id."),
    regime: str = typer.Option("sparse", help="Tiny model warm start: sparse or dense."),
    tasks: str = typer.Option("cpu", help="Task preset: cpu or paper."),
    prompt_style: str = typer.Option("compact", help="compact (tiny) or instruct (real models)."),
    chat_template: bool = typer.Option(
        False, help="Wrap prompts in the tokenizer's chat template."
    ),
    questions_per_round: int = typer.Option(
        DEFAULT_QUESTIONS_PER_ROUND, help="Questions per round (B)."
    ),
    completions_per_question: int = typer.Option(
        DEFAULT_COMPLETIONS_PER_QUESTION,
        "--completions-per-question",
        "--group-size",
        help="Completions per question (L, the GRPO group; at least 2).",
    ),
    max_new_tokens: int = typer.Option(DEFAULT_MAX_NEW_TOKENS, help="Completion cap."),
    temperature: float = typer.Option(DEFAULT_TEMPERATURE),
    top_p: float = typer.Option(DEFAULT_TOP_P),
    top_k: int = typer.Option(0, help="0 = off."),
    lr: float = typer.Option(DEFAULT_LR, help="AdamW learning rate."),
    loss_type: str = typer.Option(
        DEFAULT_LOSS_TYPE, help="Loss aggregation: grpo, dapo or dr_grpo (node.toml's loss_type)."
    ),
    seed: int = typer.Option(DEFAULT_SWARM_SEED, help="Swarm seed (questions and sampling)."),
    node_index: int = typer.Option(0, help="Node index in the task index layout."),
    device: str = typer.Option("cpu"),
    threads: int = typer.Option(1, help="torch CPU threads (1 is fastest for the tiny model)."),
    log: Path | None = typer.Option(None, help="JSONL file of per-round metrics."),
    checkpoint_dir: Path | None = typer.Option(None, help="Checkpoint directory."),
    checkpoint_every: int = typer.Option(0, help="Checkpoint every N rounds (0: only at the end)."),
    resume: bool = typer.Option(False, help="Resume from checkpoint_dir's latest checkpoint."),
    cache_dir: Path | None = typer.Option(None, help="Tiny model cache root."),
    log_level: str = typer.Option("WARNING", help="DEBUG shows every GRPO step."),
) -> None:
    """Train one node alone with GRPO (no sharing) and log per-round metrics."""
    _check_train_options(locals())
    _setup(threads, log_level)
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from sapo_async.errors import ConfigError
    from sapo_async.node.alone import run_alone
    from sapo_async.node.learner import Learner, LearnerSettings, check_fits_context
    from sapo_async.node.report import RoundReport
    from sapo_async.policy.grpo import TrainerConfig
    from sapo_async.policy.models import load_model, load_tiny_model, tiny_spec
    from sapo_async.tasks import TaskSource, preset
    from sapo_async.wire import SamplingParams

    if resume and checkpoint_dir is None:
        raise ConfigError("--resume needs --checkpoint-dir", field="checkpoint_dir")
    lm = (
        load_tiny_model(tiny_spec(regime), cache_dir=cache_dir, device=device)
        if model == "tiny"
        else load_model(model, device=device)
    )
    check_fits_context(lm.model, max_new_tokens, model_id=lm.model_id, field="--max-new-tokens")
    settings = LearnerSettings(
        swarm_seed=seed,
        node_index=node_index,
        questions_per_round=questions_per_round,
        completions_per_question=completions_per_question,
        sampling=SamplingParams(
            temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens
        ),
        prompt_style=prompt_style,  # type: ignore[arg-type]
        chat_template=chat_template,
        trainer=TrainerConfig(lr=lr, loss_type=loss_type),  # type: ignore[arg-type] # checked above
    )
    learner = Learner(
        lm.model,
        lm.tokenizer,
        TaskSource(preset(tasks), swarm_seed=seed),
        settings,
        model_id=lm.model_id,
    )
    if resume and checkpoint_dir is not None:
        learner.restore(checkpoint_dir)
    log_file = log.open("a") if log else None
    recent: list[float] = []
    with Progress(
        TextColumn("[bold]round {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeRemainingColumn(),
    ) as progress:
        bar = progress.add_task("", total=rounds)

        def on_round(m: RoundReport) -> None:
            recent.append(m.reward_mean)
            del recent[:-10]
            if log_file is not None:
                log_file.write(json.dumps(_log_line(m), sort_keys=True) + "\n")
                log_file.flush()
            done = m.round + 1
            if checkpoint_dir is not None and checkpoint_every and done % checkpoint_every == 0:
                learner.save(checkpoint_dir)
            progress.update(
                bar,
                advance=1,
                description=(
                    f"reward(10) {sum(recent) / len(recent):.3f}  informative "
                    f"{m.informative_local}/{questions_per_round}  "
                    f"{m.round_s * 1000:.0f} ms/round"
                ),
            )

        run_alone(learner, rounds, on_round=on_round)
    if log_file is not None:
        log_file.close()
    if checkpoint_dir is not None:
        learner.save(checkpoint_dir)


def _log_line(report: Any) -> dict[str, Any]:
    """A round's JSONL line: the report's fields, its step metrics flat as ``step_<name>``."""
    line = report.as_dict()
    line.update({f"step_{k}": v for k, v in line.pop("step").items()})
    return dict(line)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _check_common(threads: int, log_level: str) -> None:
    require(threads >= 1, "--threads", threads, ">= 1")
    require(log_level.upper() in _LOG_LEVELS, "--log-level", log_level, ", ".join(_LOG_LEVELS))


def _check_train_options(o: dict[str, Any]) -> None:
    """Refuse bad ``train`` options before torch is imported (each names the option)."""
    from sapo_async.tasks.spec import PRESETS

    _check_common(o["threads"], o["log_level"])
    require(o["rounds"] >= 1, "--rounds", o["rounds"], ">= 1")
    require(o["regime"] in ("sparse", "dense"), "--regime", o["regime"], "sparse or dense")
    require(o["tasks"] in PRESETS, "--tasks", o["tasks"], "one of " + ", ".join(sorted(PRESETS)))
    style = o["prompt_style"]
    require(style in ("compact", "instruct"), "--prompt-style", style, "compact or instruct")
    b, group = o["questions_per_round"], o["completions_per_question"]
    require(
        1 <= b <= MAX_QUESTIONS_PER_ROUND,
        "--questions-per-round",
        b,
        f"in 1..{MAX_QUESTIONS_PER_ROUND}",
    )
    rollouts = b * group
    require(
        rollouts <= MAX_ROLLOUTS_PER_ROUND,
        "--questions-per-round x --completions-per-question",
        rollouts,
        f"at most {MAX_ROLLOUTS_PER_ROUND} rollouts a round",
    )
    require(group >= 2, "--group-size", group, ">= 2 (GRPO compares completions of a group)")
    require(o["max_new_tokens"] >= 1, "--max-new-tokens", o["max_new_tokens"], ">= 1")
    t, p, lr = o["temperature"], o["top_p"], o["lr"]
    require(math.isfinite(t) and t > 0, "--temperature", t, "a finite number > 0")
    require(math.isfinite(p) and 0 < p <= 1, "--top-p", p, "in (0, 1]")
    require(o["top_k"] >= 0, "--top-k", o["top_k"], ">= 0 (0 is off)")
    require(math.isfinite(lr) and 0 < lr < 1, "--lr", lr, "a finite number in (0, 1)")
    loss = o["loss_type"]
    require(loss in ("grpo", "dapo", "dr_grpo"), "--loss-type", loss, "grpo, dapo or dr_grpo")
    require(o["seed"] >= 0, "--seed", o["seed"], ">= 0")
    require(o["node_index"] >= 0, "--node-index", o["node_index"], ">= 0")
    require(o["device"] in ("cpu", "cuda"), "--device", o["device"], "cpu or cuda")
    every = o["checkpoint_every"]
    require(every >= 0, "--checkpoint-every", every, ">= 0 (0: only at the end)")
    if o["log"] is not None:
        require_writable("--log", o["log"])
    if o["checkpoint_dir"] is not None:
        require_writable("--checkpoint-dir", o["checkpoint_dir"], directory=True)


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``warmstart`` to the app."""
    app.command("train")(train)
    app.command("warmstart")(warmstart)
