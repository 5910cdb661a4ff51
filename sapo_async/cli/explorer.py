"""``sapo-async explorer``: the contribution explorer, a local web page over a swarm.

Owns argument parsing only; the app is :mod:`sapo_async.explorer`. Two sources: an
existing ledger by JSON-RPC (``--rpc`` / ``--contract``, the same environment variables
as ``sapo-async audit``), with the nodes' round logs (``--logs``) and journals
(``--journal``) when given; or ``--demo``, a short embedded swarm run and served in this
process. The web stack (Starlette, uvicorn) is imported inside the command, so
``sapo-async --help`` never loads it.

Exit codes: 0 stopped by Ctrl-C; 2 bad input, a missing extra, or a port in use.
"""

# PLR0917: typer's declarative options are positional parameters.
# ruff: noqa: PLR0917

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]

DEFAULT_PORT = 8787
"""Free on a typical machine, and not the 8000/8080 that other local tools take."""


def _fail(message: str) -> typer.Exit:
    typer.secho(message, err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def explorer(
    rpc: Annotated[
        str, typer.Option("--rpc", envvar="SAPO_LEDGER_RPC", help="JSON-RPC URL of the chain.")
    ] = "http://127.0.0.1:8545",
    contract: Annotated[
        str,
        typer.Option(
            "--contract", "--ledger", envvar="SAPO_LEDGER_ADDRESS", help="SapoLedger address."
        ),
    ] = "",
    logs: Annotated[
        Path | None, typer.Option("--logs", help="Folder of the nodes' JSONL round logs.")
    ] = None,
    journal: Annotated[
        list[Path] | None,
        typer.Option("--journal", help="Journal file or folder, for inclusion checks (repeat)."),
    ] = None,
    from_block: Annotated[
        int, typer.Option("--from-block", min=0, help="Ledger deployment block (event scans).")
    ] = 0,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free).")
    ] = DEFAULT_PORT,
    demo: Annotated[
        bool, typer.Option("--demo", help="Run a short embedded swarm and explore it.")
    ] = False,
    demo_nodes: Annotated[int, typer.Option("--demo-nodes", min=1, max=16)] = 3,
    demo_rounds: Annotated[int, typer.Option("--demo-rounds", min=1)] = 20,
    demo_model: Annotated[
        str, typer.Option("--demo-model", help="'tiny', or a packaged real model (smollm2-135m).")
    ] = "tiny",
) -> None:
    """Serve the contribution explorer: who contributed what, who trained on whose
    rollouts, each node's learning, and on-chain inclusion checks."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise _fail(
            f"the explorer needs its web stack ({exc.name} is missing): "
            "pip install 'sapo_async[explorer]'"
        ) from exc
    import anyio

    from sapo_async.errors import SapoError
    from sapo_async.logs import configure_logging

    configure_logging(level="WARNING")
    try:
        if demo:
            anyio.run(_demo, host, port, demo_nodes, demo_rounds, logs, demo_model)
        else:
            if not contract:
                raise _fail("no ledger address: pass --contract or set SAPO_LEDGER_ADDRESS")
            serve = functools.partial(
                _serve,
                rpc=rpc,
                contract=contract,
                logs=logs,
                journals=journal or [],
                from_block=from_block,
                host=host,
                port=port,
            )
            anyio.run(serve)
    except SapoError as exc:
        raise _fail(f"explorer: {exc}") from exc
    except KeyboardInterrupt:
        pass  # Ctrl-C before the signal handler was in place (during start-up)
    typer.echo("explorer stopped")


async def _serve(
    *,
    rpc: str,
    contract: str,
    logs: Path | None,
    journals: list[Path],
    from_block: int,
    host: str,
    port: int,
) -> None:
    from sapo_async.explorer.app import build_app
    from sapo_async.explorer.server import serving
    from sapo_async.explorer.source import Explorer
    from sapo_async.ledger.connect import connect_ledger
    from sapo_async.ledger.index import LedgerIndex

    ledger = connect_ledger(rpc, contract, from_block=from_block)
    index = LedgerIndex(ledger)  # events read incrementally: a few RPC calls per refresh
    app = build_app(Explorer(ledger, chain=rpc, logs=logs, journals=journals, index=index))
    async with serving(app, host=host, port=port) as url:
        typer.echo(f"explorer: {url}  (ledger {ledger.address} on {rpc}; Ctrl-C stops)")
        await _until_stopped()


async def _demo(
    host: str, port: int, nodes: int, rounds: int, logs: Path | None, model: str = "tiny"
) -> None:
    import anyio

    from sapo_async.explorer.demo import DemoSettings, serve_demo

    settings = DemoSettings(nodes=nodes, rounds=rounds, model=model)
    with tempfile.TemporaryDirectory(prefix="sapo-explorer-demo-") as tmp:
        log_dir = logs or Path(tmp)
        what = "tiny-model" if model == "tiny" else model
        typer.echo(f"explorer demo: starting {nodes} {what} nodes for {rounds} rounds")
        async with serve_demo(settings, log_dir, host=host, port=port) as (swarm, url):
            typer.echo(f"explorer: {url}  (demo swarm; logs in {log_dir}; Ctrl-C stops)")

            async def announce() -> None:
                await swarm.wait_settled(timeout=float("inf"))
                typer.echo("explorer demo: the swarm finished its rounds; still serving")

            async with anyio.create_task_group() as tg:
                tg.start_soon(announce)
                await _until_stopped()
                tg.cancel_scope.cancel()


async def _until_stopped() -> None:
    """Return on SIGINT or SIGTERM, so that the swarm and the server stop in order (a
    service manager stops with SIGTERM, which would otherwise kill without cleanup)."""
    import signal

    import anyio

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


def register(app: typer.Typer) -> None:
    """Add ``explorer`` to the ``sapo-async`` app."""
    app.command("explorer")(explorer)
