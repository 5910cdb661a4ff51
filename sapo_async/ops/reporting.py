"""One call per round feeds everything a volunteer watches: status view and metrics.

Owns :class:`RoundReporter`, which a node's round loop enters once and calls
:meth:`RoundReporter.report` on after every round. It starts the Prometheus endpoint when
``metrics.prometheus_port`` is set and the status view (live table on a TTY, log lines
otherwise), and stops both on exit, in reverse order.

Does not know the node: it takes :class:`~sapo_async.node.report.RoundReport` objects. Invariant:
leaving the context releases the metrics port even if the body raised.
"""

from __future__ import annotations

from rich.console import Console

from sapo_async.node.report import RoundReport
from sapo_async.ops.config import NodeConfig
from sapo_async.ops.metrics import MetricsServer, NodeMetrics
from sapo_async.ops.service import Service
from sapo_async.ops.status import StatusView

__all__ = ["RoundReporter"]


class RoundReporter(Service):
    """Status view plus metrics for one node, fed by round reports.

    Args:
        cfg: the node config (``[metrics]`` and ``node.swarm``).
        node: the node's address (label and title).
        metrics: share a registry with other nodes in this process; a new one by default.
        live: force the live table on or off (default: on when stdout is a TTY).
        console: where the live table is drawn.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        *,
        node: str,
        metrics: NodeMetrics | None = None,
        live: bool | None = None,
        console: Console | None = None,
    ) -> None:
        self.node = node
        self.metrics = metrics if metrics is not None else NodeMetrics()
        self.view = StatusView(node=node, swarm=cfg.node.swarm, live=live, console=console)
        port = cfg.metrics.prometheus_port
        self.server: MetricsServer | None = (
            None
            if port is None
            else MetricsServer(self.metrics.registry, port=port, host=cfg.metrics.prometheus_host)
        )

    @property
    def metrics_url(self) -> str | None:
        """The scrape URL while serving, else ``None``."""
        return None if self.server is None or self.server.port is None else self.server.url

    def report(self, report: RoundReport) -> None:
        """Record one finished round in the metrics and the status view."""
        self.metrics.observe_round(report, node=self.node)
        self.view.update(report)

    def rejected(self, reason: str, count: int = 1) -> None:
        """Count rejections as they happen (the per-round report may also carry them)."""
        self.metrics.rejected(reason, count, node=self.node)

    def start(self) -> None:
        """Start the metrics endpoint (if configured), then the status view.

        Raises:
            ConfigError: the metrics port cannot be bound.
        """
        if self.server is not None:
            self.server.start()
        self.view.start()

    def stop(self) -> None:
        """Stop the view, then the endpoint; idempotent."""
        try:
            self.view.stop()
        finally:
            if self.server is not None:
                self.server.stop()
