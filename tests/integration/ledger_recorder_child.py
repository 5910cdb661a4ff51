"""Child process for the crash test: journals rounds through a Recorder, then waits forever.

Usage: python ledger_recorder_child.py RPC_URL LEDGER_ADDRESS JOURNAL ROUNDS
(node key in SAPO_TEST_NODE_KEY, relayer key in SAPO_TEST_RELAYER_KEY). Prints one line
``journaled <rounds>`` once every round is durably journaled; the parent then SIGKILLs it.
"""

from __future__ import annotations

import os
import sys

import anyio
from eth_account import Account

from sapo_async.ledger import EvmLedger, RoundCommitment, rpc_chain
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.recorder import Recorder
from sapo_async.logs import configure_logging


async def main(url: str, address: str, journal_path: str, rounds: int) -> None:
    node = Account.from_key(os.environ["SAPO_TEST_NODE_KEY"])
    relayer = Account.from_key(os.environ["SAPO_TEST_RELAYER_KEY"])
    ledger = EvmLedger(rpc_chain(url, timeout_s=1), address, relayer=relayer)
    with Journal(journal_path) as journal:
        async with Recorder(ledger, journal, node, retry_base_s=0.05, retry_max_s=0.2) as rec:
            for r in range(rounds):
                hashes = [bytes([r, i]) * 16 for i in range(4)]
                await rec.record(RoundCommitment(node.address, r, r, hashes))
            print(f"journaled {rounds}", flush=True)
            await anyio.sleep_forever()


if __name__ == "__main__":
    configure_logging(json=True)  # logs to stderr: stdout carries only the handshake line
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
