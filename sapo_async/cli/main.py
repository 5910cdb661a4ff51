"""Entry point of the ``sapo-async`` command: builds the typer app from the command modules.

Each command module exposes ``register(app: typer.Typer) -> None``; add it to
``_COMMAND_MODULES`` below. Modules are imported when the app is built, so a command's
heavy imports (torch, web3) belong inside the command function, keeping ``--help`` fast.
Every command runs inside :mod:`.boundary`: the project's errors print as one line with a
non-zero exit (``--debug`` shows the traceback).
"""

from __future__ import annotations

import importlib

import typer

from sapo_async import __version__
from sapo_async.cli import boundary

__all__ = ["build_app", "main"]

_COMMAND_MODULES: tuple[str, ...] = (
    # one line per command module, e.g. "sapo_async.cli.train"
    "sapo_async.cli.audit",
    "sapo_async.cli.explorer",
    "sapo_async.cli.hardware",
    "sapo_async.cli.node",
    "sapo_async.cli.swarm",
    "sapo_async.cli.train",
    "sapo_async.cli.volunteer",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"sapo-async {__version__}")
        raise typer.Exit


def build_app() -> typer.Typer:
    """Return the typer app with every command module registered."""
    app = typer.Typer(
        name="sapo-async",
        help="Decentralised RL post-training with collective experience sharing (SAPO).",
        no_args_is_help=True,
        add_completion=False,
        # a bug's traceback must not print local variables: they hold keys and passwords
        pretty_exceptions_show_locals=False,
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
        ),
        debug: bool = typer.Option(
            False, "--debug", help="Show the full traceback of an error (for bug reports)."
        ),
    ) -> None:
        """sapo-async: run a node, a local swarm, experiments and audits."""
        boundary.set_debug(debug)

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)
    boundary.install(app)  # every command: SapoError -> one line, non-zero exit
    return app


def main() -> None:
    """Run the command line."""
    build_app()()
