"""The volunteer's commands: ``init``, ``identity``, ``doctor`` and ``devnet``.

Each command translates :class:`~sapo_async.errors.SapoError` into a one-paragraph message
and a non-zero exit; heavy imports happen inside the command so ``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sapo_async.ops.config import NodeConfig

__all__ = ["register"]


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example config.")] = Path(
        "node.toml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented example node.toml listing every setting and its default."""
    from sapo_async.errors import ConfigError
    from sapo_async.ops.config import render_example

    if path.is_dir():
        raise ConfigError(f"{path} is a directory; give a file name such as {path / 'node.toml'}")
    if path.exists() and not force:
        typer.echo(f"{path} already exists; pass --force to overwrite it.", err=True)
        raise typer.Exit(code=1)
    anchor = path.absolute().parent
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    if not anchor.is_dir():
        raise ConfigError(f"cannot write {path}: {anchor} is a file, not a directory", field="path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_example(), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot write {path}: {exc.strerror or exc}; choose a writable directory",
            field="path",
        ) from exc
    typer.echo(f"wrote {path}; edit it, then run: sapo-async node --config {path}")


def _load(config: Path | None, **overrides: Any) -> NodeConfig:
    from sapo_async.ops.config import load_config

    if config is None and Path("node.toml").exists():
        config = Path("node.toml")
    return load_config(config, **overrides)


def doctor(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="node.toml to check (default: ./node.toml if any)."),
    ] = None,
    skip_gpu: Annotated[
        bool, typer.Option("--skip-gpu", help="Skip the GPU check (saves importing torch).")
    ] = False,
) -> None:
    """Check NATS, JetStream, the chain and contract, GPU, disk and model; explain problems."""
    import anyio

    from sapo_async.errors import SapoError
    from sapo_async.ops.doctor import format_checks, run_doctor

    try:
        cfg = _load(config)
    except SapoError as exc:
        typer.echo(f"[FAIL] config: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    checks = anyio.run(lambda: run_doctor(cfg, gpu=not skip_gpu))
    typer.echo(format_checks(checks))
    if any(check.failed for check in checks):
        raise typer.Exit(code=1)


def identity(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="node.toml (default: ./node.toml if any)."),
    ] = None,
) -> None:
    """Create the node's encrypted keystore if needed, and print its address."""
    from sapo_async.errors import SapoError
    from sapo_async.ops.identity import load_or_create_identity

    try:
        # The address is needed before the contract exists (to be funded for it), so the
        # [ledger] settings a node needs are not asked for here.
        cfg = _load(config, ledger={"enabled": False})
        account = load_or_create_identity(cfg)
    except SapoError as exc:
        typer.echo(f"identity: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    typer.echo(f"node address {account.address} (keystore {cfg.keystore_path})")


def devnet(
    swarm: Annotated[str, typer.Option(help="Swarm name the contract is deployed for.")] = "devnet",
    nats_port: Annotated[int, typer.Option(help="NATS client port.")] = 4222,
    anvil_port: Annotated[int, typer.Option(help="anvil JSON-RPC port.")] = 8545,
    data_dir: Annotated[Path, typer.Option(help="JetStream store and server logs.")] = Path(
        ".sapo/devnet"
    ),
    fund: Annotated[
        list[str] | None, typer.Option(help="Address to give 100 ETH (repeatable).")
    ] = None,
) -> None:
    """Run NATS (JetStream) and anvil locally, deploy the ledger, print node settings."""
    from sapo_async.cli.boundary import require, require_setting, require_writable
    from sapo_async.errors import SapoError
    from sapo_async.ops.config_sections import NodeSection
    from sapo_async.ops.devnet import run_devnet

    require_setting("--swarm", NodeSection, "swarm", swarm)
    for option, port in (("--nats-port", nats_port), ("--anvil-port", anvil_port)):
        require(0 < port < 65536, option, port, "a port in 1..65535")
    require(nats_port != anvil_port, "--anvil-port", anvil_port, "different from --nats-port")
    for option, port in (("--nats-port", nats_port), ("--anvil-port", anvil_port)):
        require(_port_free(port), option, port, "a free port (something listens there)")
    require_writable("--data-dir", data_dir, directory=True)
    for address in fund or []:
        require(_is_address(address), "--fund", address, "a 0x-prefixed 20-byte hex address")

    try:
        run_devnet(
            data_dir,
            swarm=swarm,
            nats_port=nats_port,
            anvil_port=anvil_port,
            fund=fund or [],
            echo=typer.echo,
        )
    except SapoError as exc:
        typer.echo(f"devnet failed: {exc}", err=True)
        raise typer.Exit(code=1) from exc


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _is_address(text: str) -> bool:
    import re

    return re.fullmatch(r"0x[0-9a-fA-F]{40}", text) is not None


def register(app: typer.Typer) -> None:
    """Add the volunteer commands to the ``sapo-async`` app."""
    app.command("init")(init)
    app.command("doctor")(doctor)
    app.command("identity")(identity)
    app.command("devnet")(devnet)
