"""The explorer's pure views: input parsing, round logs, the swarm and verify answers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sapo_async.errors import RejectedInput
from sapo_async.explorer.views import (
    LiveBacklog,
    NodeLog,
    backlog_view,
    node_view,
    parse_proof,
    parse_rollout_hash,
    read_logs,
    score_detail,
    score_of,
    swarm_view,
    verification_view,
)
from sapo_async.ledger.audit import NodeAudit, Participation, RolloutVerification
from sapo_async.ledger.score import ContributionScore
from sapo_async.ledger.types import OnChainCommitment, UsageCredit

A = "0x" + "aa" * 20
B = "0x" + "bb" * 20
H = bytes(range(32))


def audit(node: str, rounds: int = 2, credit: int = 3) -> NodeAudit:
    return NodeAudit(node, True, "model", rounds - 1, Participation(rounds, 8 * rounds, 2, credit))


def test_a_rollout_hash_is_32_bytes_of_hex_with_or_without_0x():
    assert parse_rollout_hash("0x" + H.hex()) == H
    assert parse_rollout_hash(" " + H.hex().upper() + " ") == H


@pytest.mark.parametrize("bad", ["", "0x", "0x12", "0x" + "zz" * 32, "0x" + "ab" * 33, "ab" * 31])
def test_a_malformed_rollout_hash_is_refused_naming_the_value(bad: str):
    with pytest.raises(RejectedInput, match="bad_rollout_hash") as err:
        parse_rollout_hash(bad)
    assert "0x and 64 hex digits" in str(err.value)


def test_a_proof_is_siblings_separated_by_commas_or_spaces():
    text = f"0x{H.hex()}, {H[::-1].hex()}\n0x{H.hex()}"
    assert parse_proof(text) == [H, H[::-1], H]
    assert parse_proof("  ") == []
    with pytest.raises(RejectedInput, match=r"bad_proof.*'0x12'"):
        parse_proof(f"0x{H.hex()},0x12")


def test_an_audit_without_a_score_shows_none_and_a_scored_one_shows_its_score():
    assert score_of(audit(A)) is None
    assert score_detail(audit(A)) is None
    scored = replace(audit(A), score=ContributionScore(A, 0.75, 0.5, 1.0, 2))
    assert score_of(scored) == 0.75
    assert score_detail(scored) == {"from_trusted": 0.5, "standing": 1.0, "consumers": 2}
    view = swarm_view(ledger=B, chain="x", audits=[scored], credits=[], last_seen={}, logs={})
    assert view["nodes"][0]["score"] == 0.75
    assert view["has_score"] is True
    assert node_view(scored, [], None)["score_detail"]["consumers"] == 2


def _report(node: str, rnd: int, reward: float, rejections: dict[str, int]) -> str:
    return json.dumps(
        {
            "node": node,
            "name": "n0",
            "round": rnd,
            "reward_mean": reward,
            "groups_shared": 4,
            "groups_received": 5,
            "external_used": {B: 2},
            "rejections": rejections,
        }
    )


def test_round_logs_are_read_by_node_and_a_partial_last_line_is_skipped(tmp_path: Path):
    lines = [_report(A, 0, 0.25, {"stale": 1}), _report(A, 1, 0.5, {"stale": 2, "bad": 1})]
    (tmp_path / "n0.jsonl").write_text("\n".join(lines) + '\n{"node": "0xaa', encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not a log")
    logs = read_logs(tmp_path)
    assert list(logs) == [A]
    log = logs[A]
    assert [r["round"] for r in log.rounds] == [0, 1]
    assert log.rounds[1] == {
        "round": 1,
        "reward_mean": 0.5,
        "groups_shared": 4,
        "groups_received": 5,
        "external_used": 2,
        "rejected": 3,
        "commitments_pending": 0,
        "backlog_wait_s": 0.0,
        "max_pending": None,  # a log written before the bound was reported
    }
    assert dict(log.rejections) == {"stale": 3, "bad": 1}
    assert read_logs(tmp_path / "missing") == {}


def test_the_swarm_view_copies_the_audit_and_sums_usage_edges():
    credits = [
        UsageCredit(A, B, 1, 2, 10, 0),
        UsageCredit(A, B, 2, 3, 11, 1),
        UsageCredit(B, A, 2, 1, 11, 1),
    ]
    view = swarm_view(
        ledger=B,
        chain="embedded",
        audits=[audit(A, 2, 1), audit(B, 3, 5)],
        credits=credits,
        last_seen={A: 100, B: None},
        logs={},
    )
    assert [n["rounds_committed"] for n in view["nodes"]] == [2, 3]
    assert [n["credit_received"] for n in view["nodes"]] == [1, 5]
    assert view["nodes"][0]["last_seen"] == 100
    assert view["totals"] == {
        "nodes": 2,
        "rounds_committed": 5,
        "rollouts_committed": 40,
        "external_used": 4,
        "paused_for_backlog": 0,
    }
    assert view["nodes"][0]["backlog"]["source"] is None  # no journal, log or node
    assert view["usage"] == [
        {"producer": A, "consumer": B, "count": 5},
        {"producer": B, "consumer": A, "count": 1},
    ]
    assert view["has_score"] is False


def test_the_node_view_joins_chain_rounds_and_log_rounds_by_round(tmp_path: Path):
    (tmp_path / "n0.jsonl").write_text(_report(A, 1, 0.5, {}) + "\n" + _report(A, 2, 0.7, {}))
    log = read_logs(tmp_path)[A]
    chain = [OnChainCommitment(A, r, r, H, 8, H, 2, 10 + r, 1000 + r) for r in (0, 1)]
    view = node_view(audit(A), chain, log)
    assert [r["round"] for r in view["rounds"]] == [0, 1, 2]
    assert "log" not in view["rounds"][0]
    assert view["rounds"][1]["rollouts"] == 8
    assert view["rounds"][1]["log"]["reward_mean"] == 0.5
    assert "rollouts" not in view["rounds"][2]  # a round the chain has not seen yet
    assert view["reward_curve"] == [[1, 0.5], [2, 0.7]]
    assert view["last_seen"] == 1001
    assert len(view["timeline"]) == 2


def test_the_verify_answer_is_included_only_when_every_proof_is_accepted():
    ok = RolloutVerification(H, A, 1, "own", A, True, [H])
    refused = RolloutVerification(H, B, 2, "external", A, False, [])
    assert verification_view(H, [ok], searched=2)["included"] is True
    mixed = verification_view(H, [ok, refused], searched=2)
    assert mixed["included"] is False
    assert mixed["message"] == "not included: the contract refused 1 of 2 proof(s)"
    none = verification_view(H, [], searched=3)
    assert none["included"] is False
    assert "no commitment names this hash in 3 journal(s)" in none["message"]


def _backlog_log(tmp_path: Path, pending: int, wait_s: float, bound: int | None) -> NodeLog:
    report = json.loads(_report(A, 7, 0.5, {}))
    report |= {"commitments_pending": pending, "backlog_wait_s": wait_s}
    if bound is not None:
        report["max_pending"] = bound
    (tmp_path / "n0.jsonl").write_text(json.dumps(report) + "\n")
    return read_logs(tmp_path)[A]


def test_the_backlog_is_unknown_without_journal_log_or_node():
    assert backlog_view(live=None, journal_pending=None, log=None) == {
        "pending": None,
        "paused": None,
        "max_pending": None,
        "last_wait_s": None,
        "source": None,
        "as_of_round": None,
    }


def test_the_journal_count_against_the_logged_bound_says_whether_rounds_pause(tmp_path: Path):
    log = _backlog_log(tmp_path, pending=2, wait_s=3.5, bound=4)
    over = backlog_view(live=None, journal_pending=5, log=log)
    assert (over["pending"], over["paused"], over["source"]) == (5, True, "journal")
    assert (over["max_pending"], over["last_wait_s"]) == (4, 3.5)
    assert backlog_view(live=None, journal_pending=4, log=log)["paused"] is False
    # No journal: the log's last round, said to be as of that round.
    from_log = backlog_view(live=None, journal_pending=None, log=log)
    assert (from_log["pending"], from_log["paused"]) == (2, False)
    assert (from_log["source"], from_log["as_of_round"]) == ("log", 7)
    # A journal but no bound known: pending shown, paused unknown.
    assert backlog_view(live=None, journal_pending=9, log=None)["paused"] is None
    old = _backlog_log(tmp_path, pending=2, wait_s=0.0, bound=None)
    assert backlog_view(live=None, journal_pending=9, log=old)["paused"] is None


def test_a_running_node_answers_its_backlog_exactly_on_both_pages(tmp_path: Path):
    log = _backlog_log(tmp_path, pending=0, wait_s=0.0, bound=8)
    live = {A: LiveBacklog(pending=3, paused=True, max_pending=2)}
    view = swarm_view(
        ledger=B,
        chain="embedded",
        audits=[audit(A), audit(B)],
        credits=[],
        last_seen={},
        logs={A: log},
        journal_pending={A: 1, B: 6},
        live=live,
    )
    rows = {n["node"]: n["backlog"] for n in view["nodes"]}
    assert (rows[A]["pending"], rows[A]["paused"], rows[A]["source"]) == (3, True, "node")
    assert (rows[B]["pending"], rows[B]["paused"], rows[B]["source"]) == (6, None, "journal")
    assert view["totals"]["paused_for_backlog"] == 1
    page = node_view(audit(A), [], log, journal_pending=1, live=live[A])
    assert page["backlog"] == rows[A]
