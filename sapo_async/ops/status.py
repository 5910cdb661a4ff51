"""What a volunteer sees while a node runs: a live table on a terminal, log lines otherwise.

Owns :class:`StatusState` (running totals folded from per-round
:class:`~sapo_async.node.report.RoundReport` objects), the pure :func:`render_status` (state to a
rich table, tested by rendering to text) and :class:`StatusView`, which shows the table
with ``rich.live.Live`` on a TTY or logs one structured ``round_finished`` line per round
when output is not a terminal (a service, a container, a pipe).

Does not know the node: it only reads reports. Invariants: rendering has no side effects;
totals only grow; before the first report every per-round cell shows "-".
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from sapo_async.logs import get_logger
from sapo_async.node.report import RoundReport
from sapo_async.ops.service import Service

__all__ = [
    "StatusState",
    "StatusView",
    "live_table",
    "print_unclipped",
    "render_status",
    "render_text",
    "report_log_fields",
]


@dataclass
class StatusState:
    """Running totals of one node, folded from its round reports.

    Attributes:
        node: the node's address (or name).
        swarm: the swarm it belongs to.
        last: the most recent report, if any.
        rounds: reports folded so far.
        reward_cumulative: sum of per-round mean rewards (the paper's headline number).
        groups_shared: total groups published.
        groups_received: total external groups admitted.
        rejections: total rejections by reason.
    """

    node: str = ""
    swarm: str = ""
    last: RoundReport | None = None
    rounds: int = 0
    reward_cumulative: float = 0.0
    groups_shared: int = 0
    groups_received: int = 0
    rejections: dict[str, int] = field(default_factory=dict)

    def update(self, report: RoundReport) -> None:
        """Fold one round's report into the totals."""
        self.last = report
        self.rounds += 1
        self.reward_cumulative += report.reward_mean
        self.groups_shared += report.groups_shared
        self.groups_received += report.groups_received
        for reason, count in report.rejections.items():
            self.rejections[reason] = self.rejections.get(reason, 0) + count


def render_status(state: StatusState) -> Table:
    """Return the status table for ``state`` (pure: no I/O).

    Args:
        state: the node's running totals.

    Returns:
        A two-column rich table: what, and this round / total.
    """
    last = state.last
    title = "sapo-async node"
    # Titles and cells given as str are rich markup: escape what a user or peer chose.
    if state.node:
        title += f" {escape(state.node)}"
    if state.swarm:
        title += f" in swarm {escape(repr(state.swarm))}"
    table = Table(title=title, show_header=True, header_style="bold", expand=False)
    table.add_column("", style="bold")
    table.add_column("last round", justify="right")
    table.add_column("total", justify="right")

    def cell(attribute: str, spec: str = "") -> str:
        return "-" if last is None else format(getattr(last, attribute), spec)

    table.add_row("round", cell("round"), f"{state.rounds} this run")
    table.add_row("policy version", cell("policy_version"), "")
    table.add_row("reward", cell("reward_mean", ".3f"), format(state.reward_cumulative, ".2f"))
    table.add_row("groups shared", cell("groups_shared"), str(state.groups_shared))
    table.add_row("groups received", cell("groups_received"), str(state.groups_received))
    table.add_row("external trained on", cell("external_total"), "")
    table.add_row("staleness (rounds)", cell("staleness_rounds", ".2f"), "")
    table.add_row(
        "commitments",
        f"{cell('commitments_pending')} pending",
        f"{cell('commitments_confirmed')} confirmed",
    )
    if last is not None and last.backlog_wait_s:
        table.add_row("paused for backlog", f"{last.backlog_wait_s:.1f} s", "")
    if last is not None and last.stream_missing:
        table.add_row("stream_missing", "yes: training on own groups", "")
    this_round = last.rejections if last is not None else {}
    if not state.rejections:
        table.add_row("rejections", "0", "0")
    for reason in sorted(state.rejections):
        table.add_row(
            f"rejected: {escape(reason)}",
            str(this_round.get(reason, 0)),
            str(state.rejections[reason]),
        )
    if last is not None and last.quarantined:
        table.add_row("quarantined producers", str(len(last.quarantined)), "")
    table.add_row("round time (s)", cell("round_s", ".2f"), "")
    return table


def render_text(state: StatusState, *, width: int = 80) -> str:
    """Render the status table to plain text (no colour), e.g. for tests or a log file."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    console.print(render_status(state))
    return buffer.getvalue()


def print_unclipped(console: Console, renderable: RenderableType) -> None:
    """Print ``renderable``; off a terminal, as wide as it needs.

    rich assumes 80 columns when output is piped or redirected and shrinks a table to fit,
    cutting 42-character addresses that must stay copyable. A pipe has no width, so off a
    terminal the table gets its natural width; on a terminal the terminal's width rules.
    """
    if console.is_terminal:
        console.print(renderable)
        return
    natural = Measurement.get(console, console.options.update_width(10_000), renderable)
    width = console.width
    console.width = max(width, natural.maximum)  # print(width=) is capped at console.width
    try:
        console.print(renderable)
    finally:
        console.width = width


@contextmanager
def live_table(
    renderable: RenderableType, *, console: Console, refresh_per_second: float = 2
) -> Iterator[Live]:
    """rich's ``Live`` that leaves the output on a fresh line when it ends.

    Off a terminal, ``Live`` writes its last frame without a final newline, so whatever is
    printed next (the closing audit table's title) would start on the frame's bottom border.
    """
    with Live(renderable, console=console, refresh_per_second=refresh_per_second) as live:
        yield live
    if not console.is_terminal:
        console.line()


def report_log_fields(report: RoundReport) -> dict[str, Any]:
    """The fields of one structured log line per round (``rejected_<reason>=n`` each)."""
    fields: dict[str, Any] = {
        "round": report.round,
        "policy_version": report.policy_version,
        "reward": report.reward_mean,
        "groups_shared": report.groups_shared,
        "groups_received": report.groups_received,
        "groups_trained_external": report.external_total,
        "staleness": report.staleness_rounds,
        "commitments_pending": report.commitments_pending,
        "commitments_confirmed": report.commitments_confirmed,
        "backlog_wait_s": report.backlog_wait_s,
        "stream_missing": report.stream_missing,
        "round_s": report.round_s,
        "quarantined": len(report.quarantined),
    }
    for reason, count in sorted(report.rejections.items()):
        fields[f"rejected_{reason}"] = count
    return fields


class StatusView(Service):
    """Shows a node's status: a live table on a terminal, one log line per round otherwise.

    Args:
        node: the node's address (shown in the title and bound to log lines).
        swarm: the swarm's name.
        live: force the live table (``True``) or log lines (``False``); by default live
            only when stdout is a TTY.
        console: where the live table is drawn (stdout by default).
    """

    def __init__(
        self,
        *,
        node: str = "",
        swarm: str = "",
        live: bool | None = None,
        console: Console | None = None,
    ) -> None:
        self.state = StatusState(node=node, swarm=swarm)
        self._use_live = sys.stdout.isatty() if live is None else live
        self._console = console
        self._live: Live | None = None

    @property
    def is_live(self) -> bool:
        """Whether this view draws the live table (as opposed to logging lines)."""
        return self._use_live

    def start(self) -> None:
        """Start drawing (no-op when logging lines, or already started)."""
        if self._use_live and self._live is None:
            self._live = Live(
                render_status(self.state),
                console=self._console,
                refresh_per_second=2,
                transient=False,
            )
            self._live.start()

    def update(self, report: RoundReport) -> None:
        """Fold in one finished round and show it."""
        self.state.update(report)
        if self._live is not None:
            self._live.update(render_status(self.state), refresh=True)
        elif not self._use_live:
            get_logger("status", node=self.state.node, swarm=self.state.swarm).info(
                "round_finished", **report_log_fields(report)
            )

    def stop(self) -> None:
        """Stop drawing, leaving the last table on screen; safe to call twice."""
        if self._live is not None:
            live, self._live = self._live, None
            live.stop()
            if not live.console.is_terminal:
                live.console.line()  # see live_table
