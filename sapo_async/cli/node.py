"""``sapo-async node``: a volunteer node from a TOML config (what ``just node`` runs).

Owns turning a :class:`~sapo_async.ops.config.NodeConfig` into a running node and keeping it
alive in the real world: identity from the keystore, hardware choice, resume from the last
checkpoint, a live status and metrics, and a drain on SIGINT or SIGTERM (finish the round
in progress or abandon it after ``node.drain_timeout_s``, checkpoint, flush the journal).
One node per data directory: the command holds ``<data_dir>/node.lock``
(:mod:`sapo_async.lockfile`) for its lifetime, and a second one on the same directory exits
2 naming the directory and the first one's pid.
"""

# PLC0415: lazy imports keep `--help` fast; B008: typer's declarative options.
# ruff: noqa: B008

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # pragma: no cover - typing only
    from sapo_async.node.lifecycle import Node
    from sapo_async.node.spec import NodeSpec
    from sapo_async.ops.config import NodeConfig

__all__ = ["register"]


def node(
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="Node config (sapo-async init writes one); default: ./node.toml if it exists, "
        "else the defaults.",
    ),
) -> None:
    """Join a swarm (or run alone on embedded defaults) and train until stopped."""
    from sapo_async.lockfile import hold_dir
    from sapo_async.logs import configure_logging
    from sapo_async.ops.config import load_config

    if config is None and Path("node.toml").is_file():
        config = Path("node.toml")
    cfg = load_config(config)  # a --config that names no file is an error, not the defaults
    configure_logging(level=cfg.metrics.log_level, json=cfg.metrics.log_json)
    # Held until the process ends (the kernel drops it even on SIGKILL), taken before
    # anything in the data directory is read or written: two nodes on one directory
    # committed conflicting rounds and raced on the checkpoint's LATEST (issue 55).
    with hold_dir(
        cfg.node.data_dir,
        what="data directory",
        field="node.data_dir",
        advice="run one node per data directory: stop that node, or give this one its own "
        "[node] data_dir",
    ):
        _start(cfg)


def _start(cfg: NodeConfig) -> None:
    """What ``node`` does once it holds its data directory."""
    import anyio

    from sapo_async.ops.hardware import select_backend
    from sapo_async.ops.identity import load_or_create_identity
    from sapo_async.ops.startup import require_funds, run_startup_checks

    # Before the keystore (scrypt), torch and the model: a dead server, the wrong chain or a
    # contract of another swarm fails now, in about a second, with doctor's fix.
    run_startup_checks(cfg)
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
    spec = cfg.to_spec(account=account, hardware=choice)
    relayer = spec.ledger.relayer_private_key()  # whoever pays for commitments must afford one
    require_funds(cfg, account.address, relayer=_address(relayer) if relayer else None)
    _prepare_packaged(spec.policy.model)
    anyio.run(_run, cfg, spec)


def _prepare_packaged(model: Any) -> None:
    """Check (and on first use prepare) a packaged model here, in the main thread, before
    the node starts: only there can a SIGTERM during a preparation remove its temporary
    directory and say so (the node loads its model in a worker thread)."""
    from sapo_async.policy.models.packaged import PACKAGED_MODELS, ensure_packaged_model

    if isinstance(model, str) and model in PACKAGED_MODELS:
        ensure_packaged_model(model)


def _address(key: str) -> str:
    from eth_account import Account

    return str(Account.from_key(key).address)


async def _run(cfg: NodeConfig, spec: NodeSpec) -> None:
    import anyio

    from sapo_async.node.swarm import Swarm
    from sapo_async.ops.reporting import RoundReporter

    async with Swarm.join(spec) as running:
        with RoundReporter(cfg, node=running.address) as reporter:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signal, running, tg.cancel_scope)
                async for report in running.rounds():
                    reporter.report(report)
                tg.cancel_scope.cancel()


async def _stop_on_signal(running: Node, scope: Any) -> None:
    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            typer.echo(
                f"received {signal.Signals(signum).name}: finishing the round "
                f"(at most {running.spec.drain_timeout_s:.0f} s), then checkpointing",
                err=True,
            )
            running.request_stop()
            with anyio.move_on_after(running.spec.drain_timeout_s) as deadline:
                await running.round_loop.wait_done()
            if deadline.cancelled_caught:
                running.round_loop.abandon_round()
            return


def register(app: typer.Typer) -> None:
    """Add ``node`` to the command line."""
    app.command("node")(node)
