"""The volunteer's status view: totals fold correctly and the table shows them."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from sapo_async.logs import configure_logging
from sapo_async.ops.status import StatusState, StatusView, render_text, report_log_fields
from tests.fixtures.reports import round_report

ROUND_2 = round_report(round=2, reward_mean=0.5, groups_shared=8, rejections={"stale": 4})
ROUND_3 = round_report(
    round=3,
    policy_version=3,
    reward_mean=0.625,
    groups_shared=8,
    groups_received=12,
    external_used={"0xB": 3, "0xC": 1},
    rejections={"bad_signature": 2, "stale": 1},
    staleness_rounds=1.5,
    commitments_pending=1,
    commitments_confirmed=3,
    generate_s=0.2,
    train_s=0.22,
)


def test_state_accumulates_totals_across_rounds() -> None:
    state = StatusState(node="0xabc", swarm="alpha")
    state.update(ROUND_2)
    state.update(ROUND_3)
    assert state.rounds == 2
    assert state.reward_cumulative == pytest.approx(1.125)
    assert state.groups_shared == 16
    assert state.groups_received == 12
    assert state.rejections == {"stale": 5, "bad_signature": 2}


def test_rendered_table_shows_round_reward_groups_rejections_and_commitments() -> None:
    state = StatusState(node="0xabc", swarm="alpha")
    state.update(ROUND_2)
    state.update(ROUND_3)
    text = render_text(state, width=100)
    assert "0xabc" in text
    assert "alpha" in text
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    assert "3" in lines["round"].split("│")[2]
    assert "0.625" in lines["reward"]
    assert "1.12" in lines["reward"]  # cumulative
    assert lines["groups shared"].split("│")[2].strip() == "8"
    assert lines["groups shared"].split("│")[3].strip() == "16"
    assert "12" in lines["groups received"]
    assert [c.strip() for c in lines["rejected: stale"].split("│")[2:4]] == ["1", "5"]
    assert [c.strip() for c in lines["rejected: bad_signature"].split("│")[2:4]] == ["2", "2"]
    assert "1.50" in lines["staleness (rounds)"]
    assert "1 pending" in lines["commitments"]
    assert "3 confirmed" in lines["commitments"]
    assert lines["external trained on"].split("│")[2].strip() == "4"
    assert "0.42" in lines["round time (s)"]


def test_empty_state_renders_placeholders_not_errors() -> None:
    text = render_text(StatusState())
    assert "0 this run" in text
    assert "-" in text


def test_report_log_fields_flatten_rejections() -> None:
    fields = report_log_fields(ROUND_3)
    assert fields["rejected_bad_signature"] == 2
    assert fields["rejected_stale"] == 1
    assert "rejections" not in fields
    assert fields["round"] == 3


def test_view_without_terminal_logs_one_structured_line_per_round(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(json=True)  # undone after the test (conftest's _logging_restored)
    with StatusView(node="0xabc", swarm="alpha", live=False) as view:
        view.update(ROUND_3)
    assert not view.is_live
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    finished = [line for line in lines if line.get("event") == "round_finished"]
    assert len(finished) == 1
    assert finished[0]["round"] == 3
    assert finished[0]["rejected_stale"] == 1
    assert finished[0]["node"] == "0xabc"


def test_live_view_draws_the_table_on_its_console() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, force_terminal=True, color_system=None)
    with StatusView(node="0xabc", live=True, console=console) as view:
        view.update(ROUND_3)
    assert view.is_live
    assert "groups received" in buffer.getvalue()
    assert "bad_signature" in buffer.getvalue()


def _piped() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=80, color_system=None, force_terminal=False), buffer


def test_a_table_printed_after_the_live_table_starts_on_its_own_line() -> None:
    # Off a terminal rich's Live ended its last frame without a newline: the closing audit
    # table's title printed on the live table's bottom border ("└───┘ swarm ledger audit").
    from rich.table import Table

    from sapo_async.ops.status import live_table

    console, buffer = _piped()
    live = Table(title="live")
    live.add_column("a")
    with live_table(live, console=console):
        pass
    closing = Table(title="closing")
    closing.add_column("a wide column")
    console.print(closing)
    lines = buffer.getvalue().splitlines()
    border = next(i for i, line in enumerate(lines) if "┘" in line)
    assert lines[border].strip().endswith("┘")
    assert lines[border + 1].strip() == "closing"


def test_a_piped_audit_table_keeps_full_addresses_and_shows_markup_as_text() -> None:
    from sapo_async.cli.audit import swarm_table
    from sapo_async.ledger.audit import NodeAudit, Participation
    from sapo_async.ops.status import print_unclipped

    audits = [
        NodeAudit(
            node="0x" + f"{i:x}" * 40,
            registered=True,
            metadata=metadata,
            last_round=1234,
            participation=Participation(12345, 123456, 12345, 123456),
        )
        for i, metadata in enumerate(["Qwen/Qwen2.5-0.5B-Instruct", "[/]", "[red]"])
    ]
    console, buffer = _piped()
    print_unclipped(console, swarm_table(audits))  # "[/]" raised MarkupError here
    text = buffer.getvalue()
    for a in audits:
        assert a.node in text
    assert "[/]" in text
    assert "[red]" in text


def test_status_title_and_reasons_are_shown_as_text_not_markup() -> None:
    state = StatusState(node="[/]node", swarm="s")
    state.update(round_report(rejections={"odd[/]": 1}))
    text = render_text(state, width=120)
    assert "[/]node" in text
    assert "odd[/]" in text
