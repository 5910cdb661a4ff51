"""The volunteer's commands: ``init`` (example config), ``doctor`` (checks), ``devnet``.

Each command translates :class:`~sapo_async.errors.SapoError` into a one-paragraph message
and a non-zero exit; heavy imports happen inside the command so ``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["register"]


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example config.")] = Path(
        "node.toml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented example node.toml listing every setting and its default."""
    from sapo_async.config import render_example  # noqa: PLC0415 - keeps --help fast

    if path.exists() and not force:
        typer.echo(f"{path} already exists; pass --force to overwrite it.", err=True)
        raise typer.Exit(code=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_example(), encoding="utf-8")
    typer.echo(f"wrote {path}; edit it, then run: sapo-async node --config {path}")


def register(app: typer.Typer) -> None:
    """Add the volunteer commands to the ``sapo-async`` app."""
    app.command("init")(init)
