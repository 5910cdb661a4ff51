"""The command line's error boundary: our errors are one line, also from inside a task group."""

from __future__ import annotations

import anyio
import pytest
import typer
from typer.testing import CliRunner

from sapo_async.cli.boundary import install
from sapo_async.errors import ConfigError, JournalError


def _app(fail: object) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def run() -> None:
        fail()  # type: ignore[operator]

    @app.command()
    def other() -> None:  # two commands, so typer keeps the command name
        pass

    install(app)
    return app


def _in_a_task_group(*errors: BaseException) -> None:
    async def main() -> None:
        async def raise_(exc: BaseException) -> None:
            raise exc

        async with anyio.create_task_group() as tg:
            for exc in errors:
                tg.start_soon(raise_, exc)

    anyio.run(main)


def test_our_error_from_inside_a_task_group_is_one_line_not_a_traceback() -> None:
    journal = JournalError("cannot write the ledger journal /d/j.sqlite: full")
    result = CliRunner().invoke(_app(lambda: _in_a_task_group(journal)), ["run"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: cannot write the ledger journal /d/j.sqlite: full"
    ]
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_config_error_inside_a_task_group_keeps_its_exit_code() -> None:
    bad = ConfigError("node.data_dir = /x: held by pid 7", field="node.data_dir")
    result = CliRunner().invoke(_app(lambda: _in_a_task_group(bad)), ["run"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: node.data_dir = /x: held by pid 7"]


@pytest.mark.parametrize("bug", [RuntimeError("a bug"), KeyError("k")])
def test_a_bug_beside_our_error_keeps_its_traceback(bug: Exception) -> None:
    journal = JournalError("cannot write the ledger journal")
    result = CliRunner().invoke(_app(lambda: _in_a_task_group(journal, bug)), ["run"])
    assert isinstance(result.exception, BaseExceptionGroup)
    assert "error:" not in result.stderr
