"""Defence drops and quarantined producers reach metrics, the status table and the log line."""

from __future__ import annotations

from sapo_async.ops.metrics import NodeMetrics
from sapo_async.ops.status import StatusState, render_text, report_log_fields
from tests.fixtures.reports import round_report


def _report():  # type: ignore[no-untyped-def]
    return round_report(
        rejections={"implausible": 3, "quarantined": 5, "task_outside_preset": 1},
        quarantined=("0xBAD1", "0xBAD2"),
    )


def test_metrics_count_defence_drops_by_reason_and_gauge_quarantined_producers() -> None:
    metrics = NodeMetrics()
    metrics.observe_round(_report(), node="0xA")
    text = metrics.exposition().decode()
    assert 'sapo_rejections_total{node="0xA",reason="implausible"} 3.0' in text
    assert 'sapo_rejections_total{node="0xA",reason="quarantined"} 5.0' in text
    assert 'sapo_quarantined_producers{node="0xA"} 2.0' in text


def test_status_and_log_line_show_drops_and_quarantine() -> None:
    state = StatusState(node="0xA")
    state.update(_report())
    text = render_text(state, width=100)
    assert "rejected: implausible" in text
    assert "quarantined producers" in text
    fields = report_log_fields(_report())
    assert fields["rejected_task_outside_preset"] == 1
    assert fields["quarantined"] == 2
