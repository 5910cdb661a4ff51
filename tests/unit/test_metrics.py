"""Node metrics: round reports become Prometheus series, scraped over loopback HTTP."""

from __future__ import annotations

import dataclasses
import socket
import urllib.request
from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.ops.metrics import MetricsServer, NodeMetrics
from tests.fixtures.reports import round_report

REPORT = round_report(
    round=7,
    policy_version=7,
    reward_mean=0.25,
    groups_shared=8,
    groups_received=5,
    external_used={"0xB": 4},
    rejections={"stale": 2, "bad_signature": 1},
    staleness_rounds=1.5,
    commitments_pending=2,
    commitments_confirmed=6,
    train_s=0.8,
)


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in exposition:\n{text}")


def test_round_reports_update_counters_and_gauges() -> None:
    metrics = NodeMetrics()
    metrics.observe_round(REPORT, node="0xA")
    metrics.observe_round(dataclasses.replace(REPORT, round=8, rejections={"stale": 1}), node="0xA")
    text = metrics.exposition().decode()
    assert _sample(text, 'sapo_rounds_total{node="0xA"}') == 2
    assert _sample(text, 'sapo_round{node="0xA"}') == 8
    assert _sample(text, 'sapo_reward_cumulative{node="0xA"}') == 0.5
    assert _sample(text, 'sapo_groups_shared_total{node="0xA"}') == 16
    assert _sample(text, 'sapo_groups_received_total{node="0xA"}') == 10
    assert _sample(text, 'sapo_groups_trained_external_total{node="0xA"}') == 8
    assert _sample(text, 'sapo_rejections_total{node="0xA",reason="stale"}') == 3
    assert _sample(text, 'sapo_rejections_total{node="0xA",reason="bad_signature"}') == 1
    assert _sample(text, 'sapo_staleness_rounds{node="0xA"}') == 1.5
    assert _sample(text, 'sapo_commitments_pending{node="0xA"}') == 2
    assert _sample(text, 'sapo_commitments_confirmed{node="0xA"}') == 6
    assert _sample(text, 'sapo_round_seconds_count{node="0xA"}') == 2


def test_completions_left_out_are_counted_by_reason_over_producers() -> None:
    metrics = NodeMetrics()
    left_out = {"0xB": {"stock_lead": 2, "after_answer": 1}, "0xC": {"stock_lead": 3}}
    metrics.observe_round(dataclasses.replace(REPORT, external_left_out=left_out), node="0xA")
    metrics.observe_round(REPORT, node="0xA")  # nothing left out: nothing added
    text = metrics.exposition().decode()
    assert _sample(text, 'sapo_completions_left_out_total{node="0xA",reason="stock_lead"}') == 5
    assert _sample(text, 'sapo_completions_left_out_total{node="0xA",reason="after_answer"}') == 1


def test_every_metric_a_node_serves_is_in_the_volunteer_guides_table() -> None:
    table = (Path(__file__).resolve().parents[2] / "docs" / "volunteer.md").read_text()
    families = list(NodeMetrics().registry.collect())
    assert len(families) == 16
    suffix = {"counter": "_total"}
    for family in families:
        shown = family.name + suffix.get(family.type, "")
        assert f"| `{shown}" in table, f"docs/volunteer.md's metrics table lacks {shown}"


def test_two_nodes_share_one_registry_by_label() -> None:
    metrics = NodeMetrics()
    metrics.observe_round(REPORT, node="0xA")
    metrics.rejected("oversize", node="0xB")
    text = metrics.exposition().decode()
    assert _sample(text, 'sapo_rejections_total{node="0xB",reason="oversize"}') == 1
    assert _sample(text, 'sapo_rounds_total{node="0xA"}') == 1


def test_endpoint_serves_the_metrics_over_loopback_and_releases_its_port() -> None:
    metrics = NodeMetrics()
    metrics.observe_round(REPORT, node="0xA")
    server = MetricsServer(metrics.registry, port=0)
    port = server.start()
    try:
        assert server.start() == port  # idempotent
        with urllib.request.urlopen(server.url, timeout=5) as response:
            body = response.read().decode()
        assert 'sapo_groups_shared_total{node="0xA"} 8.0' in body
    finally:
        server.stop()
    server.stop()  # idempotent
    with MetricsServer(metrics.registry, port=port) as again:  # the port is free again
        assert again.port == port


def test_busy_port_is_a_config_error_naming_the_setting() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with (
            pytest.raises(ConfigError, match="prometheus_port"),
            MetricsServer(NodeMetrics().registry, port=port),
        ):
            pass
