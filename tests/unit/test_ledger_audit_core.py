"""expected_participation: the numbers an audit must report, from commitments (pure)."""

from __future__ import annotations

import os

from web3 import Web3

from sapo_async.cli.audit import swarm_table
from sapo_async.ledger.audit import NodeAudit, Participation, expected_participation
from sapo_async.ledger.types import RoundCommitment

A, B, C = (Web3.to_checksum_address("0x" + f"{i:02x}" * 20) for i in (10, 11, 12))


def h(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


def test_expected_participation_counts_rounds_rollouts_usage_and_credit():
    commitments = [
        RoundCommitment(A, 0, 0, h(3)),
        RoundCommitment(A, 1, 1, h(2), {B: {0: h(4)}, C: {0: h(1)}}),
        RoundCommitment(B, 0, 0, h(5), {A: {0: h(2)}}),
    ]
    assert expected_participation(commitments) == {
        A: Participation(
            rounds_committed=2, rollouts_committed=5, external_used=5, credit_received=2
        ),
        B: Participation(
            rounds_committed=1, rollouts_committed=5, external_used=2, credit_received=4
        ),
        C: Participation(credit_received=1),  # credited without ever committing
    }


def test_swarm_table_has_one_row_per_node():
    audits = [
        NodeAudit(A, True, "m", 3, Participation(4, 10, 2, 1)),
        NodeAudit(B, False, "", None, Participation()),
    ]
    table = swarm_table(audits)
    assert table.row_count == 2
    assert [c.header for c in table.columns][:3] == ["node", "metadata", "rounds"]


def test_revert_data_is_read_whichever_quote_python_used_for_the_bytes():
    from sapo_async.ledger.chain import _revert_data

    # eth-tester puts repr(bytes) in the message; bytes holding a single quote are shown
    # with double quotes, which depends on the addresses and numbers in the error.
    for data in (b"\x06\x83ab", b";\x16L'\x00\x05"):
        assert _revert_data(Exception(f"execution reverted: {data!r}")) == data
    assert _revert_data(Exception("execution reverted")) is None
