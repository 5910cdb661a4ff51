"""RoundReporter: one report per round reaches both the scrape endpoint and the status."""

from __future__ import annotations

import io
import urllib.request

from rich.console import Console

from sapo_async.ops.config import load_config
from sapo_async.ops.reporting import RoundReporter
from tests.fixtures.reports import round_report


def test_round_report_reaches_metrics_endpoint_and_live_status() -> None:
    cfg = load_config(node={"swarm": "alpha"}, metrics={"prometheus_port": 0})
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, force_terminal=True, color_system=None)
    with RoundReporter(cfg, node="0xA", live=True, console=console) as reporter:
        reporter.report(
            round_report(round=1, reward_mean=0.5, groups_shared=8, rejections={"stale": 1})
        )
        reporter.rejected("oversize")
        url = reporter.metrics_url
        assert url is not None
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    assert 'sapo_groups_shared_total{node="0xA"} 8.0' in body
    assert 'sapo_rejections_total{node="0xA",reason="oversize"} 1.0' in body
    assert 'sapo_rejections_total{node="0xA",reason="stale"} 1.0' in body
    assert "alpha" in buffer.getvalue()
    assert reporter.view.state.rounds == 1
    assert reporter.metrics_url is None  # stopped on exit


def test_reporter_without_port_serves_nothing() -> None:
    cfg = load_config()
    with RoundReporter(cfg, node="0xA", live=False) as reporter:
        assert reporter.server is None
        assert reporter.metrics_url is None
