"""One node per data directory and per key on a ledger (issue 55): the locks themselves.

Two attempts in one process stand in for two processes: ``flock`` locks belong to an open
file, so a second open of the same lock file is refused like another process's would be.
The two-process case runs real nodes in tests/badinput/test_one_node_per_data_dir.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import pytest
from eth_account import Account

from sapo_async.errors import ConfigError
from sapo_async.lockfile import hold_dir, hold_key
from sapo_async.node.spec import NodeSpec
from sapo_async.node.swarm import complete_spec, node_locks

LEDGER = "0x" + "1" * 40 + " on chain 31337"


@pytest.fixture(autouse=True)
def _key_locks_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_second_hold_of_a_data_directory_is_refused_naming_it_and_the_holders_pid(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with hold_dir(data, what="data directory", field="node.data_dir", advice="stop it") as lock:
        assert lock.read_text().strip() == str(os.getpid())
        with (
            pytest.raises(ConfigError) as err,
            hold_dir(data, what="data directory", field="node.data_dir", advice="stop it"),
        ):
            pytest.fail("a second holder got the lock")
    message = str(err.value)
    assert "\n" not in message
    assert f"data directory {data}" in message
    assert f"pid {os.getpid()}" in message
    assert message.endswith(": stop it")
    assert err.value.field == "node.data_dir"


def test_a_released_lock_is_taken_again_and_leaves_no_lock_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with hold_dir(data, what="data directory", field="node.data_dir", advice="") as lock:
        pass
    assert not lock.exists()
    with hold_dir(data, what="data directory", field="node.data_dir", advice=""):
        pass


def test_a_lock_file_left_by_a_dead_holder_does_not_block(tmp_path: Path) -> None:
    # What a node killed with SIGKILL leaves: the file with its pid, no lock on it.
    data = tmp_path / "data"
    data.mkdir()
    (data / "node.lock").write_text("999999999\n")
    with hold_dir(data, what="data directory", field="node.data_dir", advice="") as lock:
        assert lock.read_text().strip() == str(os.getpid())


def test_one_key_on_one_ledger_is_held_once_and_elsewhere_freely() -> None:
    key = Account.create().address
    with hold_key(key, ledger=LEDGER):
        with (
            pytest.raises(ConfigError) as err,
            hold_key(key.lower(), ledger=LEDGER, shown="0xC0ffee"),
        ):
            pytest.fail("a second node got the same key on the same ledger")
        with hold_key(key, ledger="0x" + "2" * 40 + " on chain 31337"):
            pass  # another ledger
        with hold_key(Account.create().address, ledger=LEDGER):
            pass  # another key
    message = str(err.value)
    assert key.lower() in message.lower()
    assert "ledger 0xC0ffee" in message
    assert f"pid {os.getpid()}" in message
    assert err.value.field == "identity.keystore"


def test_a_python_node_locks_its_checkpoint_directory_and_its_key_on_an_rpc_ledger(
    tmp_path: Path,
) -> None:
    account = Account.create()
    ledger = {
        "rpc_url": "http://127.0.0.1:8545",
        "contract_address": "0x" + "1" * 40,
    }
    first = complete_spec(
        NodeSpec.build(
            account=account,
            checkpoint_dir=tmp_path / "a" / "checkpoints",
            journal_path=tmp_path / "a" / "journal.sqlite",
            **ledger,
        )
    )
    same_dir = first.replace(account=Account.create())
    same_key = first.replace(
        checkpoint_dir=tmp_path / "b" / "checkpoints", journal_path=tmp_path / "b" / "j.sqlite"
    )
    with _entered(node_locks(first)):
        with (
            pytest.raises(ConfigError, match="checkpoint directory") as by_dir,
            _entered(node_locks(same_dir)),
        ):
            pytest.fail("two nodes on one checkpoint directory")
        with (
            pytest.raises(ConfigError, match=f"key {account.address}") as by_key,
            _entered(node_locks(same_key)),
        ):
            pytest.fail("two nodes with one key on one ledger")
    assert by_dir.value.field == "checkpoint.dir"
    assert by_key.value.field == "identity.keystore"
    with _entered(node_locks(same_dir)), _entered(node_locks(same_key)):
        pass  # released when the first left
    alone = complete_spec(NodeSpec.build(account=account, ledger_enabled=False))
    assert node_locks(alone) == []


@contextmanager
def _entered(locks: Sequence[AbstractContextManager[Path]]) -> Iterator[None]:
    with ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield
