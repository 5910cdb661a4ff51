"""What every bad-input case asserts, in one place.

A case runs a real command (in-process through typer's CliRunner, or as a subprocess) in a
sandbox directory and checks the four things issue 15 asks of every bad input:

1. the exit code (2 for the volunteer's input, 1 for the world, as ``cli/boundary.py`` says);
2. exactly one ``error:`` line on stderr, naming the culprit (file, key, variable or option)
   and its value or what is allowed;
3. no traceback anywhere in the output, and no exception escaping the command;
4. no file in the sandbox deleted or rewritten (hashes before and after).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from sapo_async.cli.main import build_app

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Outcome:
    """What a command did: its exit code, its two streams, and any escaped exception."""

    code: int
    stdout: str
    stderr: str
    escaped: BaseException | None = None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def error_lines(self, prefix: str = "error:") -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith(prefix)]


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root``, by relative path."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def invoke(args: Sequence[str], *, env: Mapping[str, str] | None = None) -> Outcome:
    """Run ``sapo-async ARGS`` in this process (the environment is restored after)."""
    result = CliRunner().invoke(build_app(), list(args), env=dict(env or {}))
    escaped = None if isinstance(result.exception, SystemExit | None) else result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr, escaped)


def run_subprocess(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    python_flags: Sequence[str] = (),
) -> Outcome:
    """Run ``python -m sapo_async ARGS`` as a real process, SAPO_* variables cleared."""
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("SAPO_")}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, *python_flags, "-m", "sapo_async", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def assert_refused(
    outcome: Outcome,
    *culprits: str,
    code: int = 2,
    prefix: str = "error:",
    before: Mapping[str, str] | None = None,
    sandbox: Path | None = None,
) -> str:
    """Assert the four properties; return the error line.

    Args:
        outcome: what the command did.
        culprits: strings the error line must contain (the key, the value, the fix...).
        code: the expected exit code.
        prefix: how the error line starts (doctor reports ``[FAIL] config:``).
        before: :func:`snapshot` of ``sandbox`` taken before the command.
        sandbox: the directory whose files must be unchanged.
    """
    assert outcome.escaped is None, f"exception escaped: {outcome.escaped!r}\n{outcome.output}"
    assert "Traceback" not in outcome.output, outcome.output
    assert outcome.code == code, f"exit {outcome.code}, expected {code}\n{outcome.output}"
    lines = outcome.error_lines(prefix)
    assert len(lines) == 1, f"expected one {prefix!r} line on stderr:\n{outcome.output}"
    line = lines[0]
    for culprit in culprits:
        assert culprit in line, f"{culprit!r} not named in: {line}"
    if before is not None:
        assert sandbox is not None
        after = snapshot(sandbox)
        changed = {p for p, h in before.items() if after.get(p) != h}
        assert not changed, f"deleted or rewritten: {sorted(changed)}"
    return line
