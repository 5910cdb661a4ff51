"""Prometheus metrics of a node, and the HTTP endpoint that serves them.

Owns :class:`NodeMetrics` (the metric families, labelled by node address, in a registry
of their own) and :class:`MetricsServer` (a threaded HTTP server with a clean start/stop).
Metrics are fed from the per-round :class:`~sapo_async.node.report.RoundReport`, plus
:meth:`NodeMetrics.rejected` for a collector that counts rejections as they happen.

Does not know the node. Invariants: several nodes in one process share a registry safely
(one ``node`` label each); counters only grow; a stopped server has released its port.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from sapo_async.errors import ConfigError
from sapo_async.limits import METRICS_STOP_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.node.report import RoundReport
from sapo_async.ops.service import Service

__all__ = ["MetricsServer", "NodeMetrics"]


_log = get_logger("metrics")


class NodeMetrics:
    """The metric families of one or more nodes, in one registry.

    Args:
        registry: where the metrics live; a fresh one by default (so tests and several
            swarms in one process never collide with the global default registry).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rounds = Counter("sapo_rounds", "Rounds finished.", ["node"], registry=r)
        self.round = Gauge("sapo_round", "The node's current round.", ["node"], registry=r)
        self.policy_version = Gauge(
            "sapo_policy_version", "Optimizer steps taken.", ["node"], registry=r
        )
        self.reward = Gauge(
            "sapo_reward", "Mean own reward in the last round.", ["node"], registry=r
        )
        self.reward_cumulative = Gauge(
            "sapo_reward_cumulative",
            "Sum over rounds of the mean own reward (the paper's cumulative reward).",
            ["node"],
            registry=r,
        )
        self.groups_shared = Counter(
            "sapo_groups_shared", "Question groups published.", ["node"], registry=r
        )
        self.groups_received = Counter(
            "sapo_groups_received", "External groups admitted.", ["node"], registry=r
        )
        self.groups_trained_external = Counter(
            "sapo_groups_trained_external", "External groups trained on.", ["node"], registry=r
        )
        self.rejections = Counter(
            "sapo_rejections",
            "External groups rejected, by reason.",
            ["node", "reason"],
            registry=r,
        )
        self.left_out = Counter(
            "sapo_completions_left_out",
            "Completions of scored external groups left out before judging, by reason.",
            ["node", "reason"],
            registry=r,
        )
        self.staleness = Gauge(
            "sapo_staleness_rounds",
            "Mean rounds behind of the groups trained on in the last round.",
            ["node"],
            registry=r,
        )
        self.commitments_pending = Gauge(
            "sapo_commitments_pending",
            "Commitments journaled, not yet on chain.",
            ["node"],
            registry=r,
        )
        self.commitments_confirmed = Gauge(
            "sapo_commitments_confirmed",
            "Commitments confirmed on chain.",
            ["node"],
            registry=r,
        )
        self.backlog_wait = Counter(
            "sapo_backlog_wait_seconds",
            "Seconds rounds were paused for the commitment backlog (ledger.max_pending).",
            ["node"],
            registry=r,
        )
        self.quarantined = Gauge(
            "sapo_quarantined_producers",
            "Producers this node refuses now (too many of their groups dropped).",
            ["node"],
            registry=r,
        )
        self.round_seconds = Histogram(
            "sapo_round_seconds",
            "Wall-clock time per round.",
            ["node"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )

    def observe_round(self, report: RoundReport, *, node: str = "") -> None:
        """Update every metric from one finished round's report.

        Args:
            report: the round's report.
            node: the node's address (the ``node`` label).
        """
        self.rounds.labels(node).inc()
        self.round.labels(node).set(report.round)
        self.policy_version.labels(node).set(report.policy_version)
        self.reward.labels(node).set(report.reward_mean)
        self.reward_cumulative.labels(node).inc(report.reward_mean)
        self.groups_shared.labels(node).inc(report.groups_shared)
        self.groups_received.labels(node).inc(report.groups_received)
        self.groups_trained_external.labels(node).inc(report.external_total)
        for reason, count in report.rejections.items():
            self.rejected(reason, count, node=node)
        for counts in report.external_left_out.values():
            for reason, count in counts.items():
                self.left_out.labels(node, reason).inc(count)
        self.staleness.labels(node).set(report.staleness_rounds)
        self.commitments_pending.labels(node).set(report.commitments_pending)
        self.commitments_confirmed.labels(node).set(report.commitments_confirmed)
        self.backlog_wait.labels(node).inc(report.backlog_wait_s)
        self.quarantined.labels(node).set(len(report.quarantined))
        self.round_seconds.labels(node).observe(report.round_s)

    def rejected(self, reason: str, count: int = 1, *, node: str = "") -> None:
        """Count ``count`` rejected external groups for ``reason``."""
        if count:
            self.rejections.labels(node, reason).inc(count)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what a scrape returns)."""
        return bytes(generate_latest(self.registry))


class MetricsServer(Service):
    """Serves a registry over HTTP for Prometheus to scrape, from a daemon thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop` (idempotent).

    Args:
        registry: what to serve (``NodeMetrics.registry``).
        port: TCP port; 0 picks a free one (read :attr:`port` after start).
        host: interface to bind; loopback by default so nothing is exposed by accident.
    """

    def __init__(self, registry: CollectorRegistry, *, port: int, host: str = "127.0.0.1") -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics port {port} is not in 0..65535", field="prometheus_port")
        self._registry = registry
        self._host = host
        self._requested_port = port
        self._server: object | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """The scrape URL (``http://host:port/metrics``); only valid while started."""
        return f"http://{self._host}:{self.port}/metrics"

    def start(self) -> int:
        """Bind and start serving; returns the bound port.

        Raises:
            ConfigError: the port cannot be bound (in use, or not permitted).
        """
        if self._server is not None and self.port is not None:
            return self.port
        try:
            server, thread = start_http_server(
                self._requested_port, addr=self._host, registry=self._registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {self._host}:{self._requested_port}: {exc}; choose "
                "another metrics.prometheus_port",
                field="metrics.prometheus_port",
            ) from exc
        self._server, self._thread = server, thread
        self.port = int(server.server_port)
        _log.info("metrics_server_started", url=self.url)
        return self.port

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
        thread.join(timeout=METRICS_STOP_TIMEOUT_S)
        _log.info("metrics_server_stopped", port=self.port)
        self.port = None
