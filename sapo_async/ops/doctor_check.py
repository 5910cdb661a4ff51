"""What one doctor check found, and the plain-text report of them all.

Owns :class:`Check` (status ``ok``, ``warn`` or ``fail``, what was found, and how to fix
it), the one shape every check in :mod:`sapo_async.ops.doctor` and
:mod:`sapo_async.ops.doctor_disk` returns, and :func:`format_checks`, which renders a list of
them as lines and a verdict.

Does not know what is checked, nor how: it imports nothing of the node, its config or
its services. Invariant: a report says "failed" iff some check's status is ``fail``
(``warn`` does not fail).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Check", "Status", "format_checks"]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: what was checked (``nats nats://host:4222``, ``contract``, ``gpu``...).
        status: ``ok``, ``warn`` (works, but worth knowing) or ``fail`` (the node will not
            work until fixed).
        detail: what was found, in plain words.
        fix: what to do about it (empty when nothing).
    """

    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        """Whether this check failed."""
        return self.status == "fail"


_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def format_checks(checks: Sequence[Check]) -> str:
    """Plain-text report: one line per check, a ``fix:`` line under each problem, a verdict."""
    lines = []
    for check in checks:
        lines.append(f"[{_MARK[check.status]}] {check.name}: {check.detail}")
        if check.fix and check.status != "ok":
            lines.append(f"       fix: {check.fix}")
    failed = sum(check.failed for check in checks)
    lines.append(
        "all checks passed" if not failed else f"{failed} check(s) failed: fix them and rerun"
    )
    return "\n".join(lines)
