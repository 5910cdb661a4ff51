"""``sapo-async node``: a volunteer node from a TOML config (what ``just node`` runs).

Owns turning a :class:`~sapo_async.ops.config.NodeConfig` into a running node and keeping it
alive in the real world: identity from the keystore, hardware choice, resume from the last
checkpoint, a live status and metrics, and a drain on SIGINT or SIGTERM (finish the round
in progress or abandon it after ``node.drain_timeout_s``, checkpoint, flush the journal).
"""

# PLC0415: lazy imports keep `--help` fast; B008: typer's declarative options.
# ruff: noqa: B008

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # pragma: no cover - typing only
    from eth_account.signers.local import LocalAccount

    from sapo_async.node.loop import Node, RoundReport
    from sapo_async.ops.config import NodeConfig
    from sapo_async.ops.hardware import HardwareChoice

__all__ = ["join_kwargs", "register", "report_dict"]


def join_kwargs(cfg: NodeConfig, account: LocalAccount, choice: HardwareChoice) -> dict[str, Any]:
    """The :meth:`~sapo_async.node.swarm.Swarm.join` arguments a config asks for."""
    from sapo_async.fabric.transport.embedded import NatsOptions
    from sapo_async.policy.grpo.trainer import TrainerConfig
    from sapo_async.tasks.spec import FamilySpec

    t = cfg.training
    n = cfg.nats
    tasks: Any = cfg.tasks.preset
    if cfg.tasks.families:
        tasks = tuple(FamilySpec(f, {}) for f in cfg.tasks.families)
    ledger: bool | str = False
    if cfg.ledger.enabled:
        ledger = cfg.ledger.rpc_url or True
    return {
        "swarm": cfg.node.swarm,
        "name": cfg.node.name or None,
        "model": choice.model,
        "regime": cfg.tasks.regime,
        "tasks": tasks,
        "local": t.local,
        "external": t.external,
        "questions": t.questions_per_round,
        "completions": t.completions_per_question,
        "nats_url": ",".join(n.urls) or None,
        "nats_options": NatsOptions(
            url=",".join(n.urls) or None,
            creds_file=n.creds_file,
            nkey_seed_file=n.nkey_seed_file,
            tls_ca_file=n.tls_ca,
            tls_cert_file=n.tls_cert,
            tls_key_file=n.tls_key,
        ),
        "start": "new" if n.start == "new" else float(n.lookback_minutes) * 60.0,
        "ledger": ledger,
        "contract_address": cfg.ledger.contract_address,
        "account": account,
        "seed": cfg.node.seed,
        "rounds": cfg.node.rounds,
        "sampler": t.sampler,
        "per_producer_cap": t.per_producer_cap,
        "max_staleness_rounds": t.max_staleness_rounds,
        "max_new_tokens": t.max_new_tokens,
        "temperature": t.temperature,
        "top_p": t.top_p,
        "trainer": TrainerConfig(
            lr=t.lr,
            aggregation=t.loss_type,
            eps_low=t.clip_low,
            eps_high=t.clip_high,
            beta=t.kl_beta,
        ),
        "device": choice.device,
        "backend": choice.backend,
        "gpu_memory_utilization": choice.gpu_memory_utilization or 0.3,
        "journal_path": cfg.journal_dir / "journal.sqlite",
        "checkpoint_dir": cfg.checkpoint_dir,
        "checkpoint_every": cfg.node.checkpoint_every,
        "drain_timeout_s": cfg.node.drain_timeout_s,
        "overlap": t.overlap_generation,
        "sleep_mode": cfg.model.sleep_mode and choice.backend == "vllm",
    }


def report_dict(report: RoundReport) -> dict[str, Any]:
    """The status/metrics view of a node's round report (:mod:`sapo_async.node.report`)."""
    return {
        "round": report.round,
        "policy_version": report.policy_version,
        "reward": report.reward_mean,
        "groups_shared": report.groups_shared,
        "groups_trained_external": report.external_total,
        "rejections": report.rejections,
        "staleness": report.staleness_rounds,
        "commitments_pending": report.commitments_pending,
        "commitments_confirmed": report.commitments_confirmed,
        "round_s": report.generate_s + report.publish_s + report.score_s + report.train_s,
    }


def node(
    config: Path = typer.Option(
        Path("node.toml"), help="Node config (sapo-async init writes one)."
    ),
) -> None:
    """Join a swarm (or run alone on embedded defaults) and train until stopped."""
    import anyio

    from sapo_async.logs import configure_logging
    from sapo_async.ops.config import load_config
    from sapo_async.ops.hardware import select_backend
    from sapo_async.ops.identity import load_or_create_identity

    cfg = load_config(config if config.is_file() else None)
    configure_logging(level=cfg.metrics.log_level, json=cfg.metrics.log_json)
    account = load_or_create_identity(cfg)
    typer.echo(f"node address: {account.address}")
    choice = select_backend(
        cfg.model.backend,
        model=None if cfg.model.name_or_path == "auto" else cfg.model.name_or_path,
        device=None if cfg.model.device == "auto" else cfg.model.device,
        gpu_memory_utilization=cfg.model.gpu_memory_utilization,
    )
    typer.echo(
        f"backend: {choice.backend} on {choice.device}, model {choice.model} ({choice.reason})"
    )
    if choice.backend == "vllm":
        typer.echo("note: the vLLM path has not yet run on a GPU in this project (docs/gpu.md)")
    anyio.run(_run, cfg, account, choice)


async def _run(cfg: NodeConfig, account: LocalAccount, choice: HardwareChoice) -> None:
    import anyio

    from sapo_async.node.swarm import Swarm
    from sapo_async.ops.reporting import RoundReporter

    kwargs = join_kwargs(cfg, account, choice)
    async with Swarm.join(**kwargs) as running:
        with RoundReporter(cfg, node=running.address) as reporter:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signal, running, tg.cancel_scope)
                async for report in running.rounds():
                    reporter.report(report_dict(report))  # type: ignore[arg-type]
                tg.cancel_scope.cancel()


async def _stop_on_signal(running: Node, scope: Any) -> None:
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            typer.echo(
                f"received {signal.Signals(signum).name}: finishing the round "
                f"(at most {running.drain_timeout_s:.0f} s), then checkpointing",
                err=True,
            )
            running.request_stop()
            with anyio.move_on_after(running.drain_timeout_s) as deadline:
                await running.wait_stopped()
            if deadline.cancelled_caught:
                running.abandon_round()
            return


def register(app: typer.Typer) -> None:
    """Add ``node`` to the command line."""
    app.command("node")(node)
