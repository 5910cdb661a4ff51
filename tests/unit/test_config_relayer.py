"""[ledger] relayer_key_file: the account that pays for a node's commitments."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account

from sapo_async.errors import ConfigError
from sapo_async.ops.config import load_config
from sapo_async.ops.hardware import HardwareChoice

HARDWARE = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
LEDGER = {"rpc_url": "http://127.0.0.1:8545", "contract_address": "0x" + "2" * 40}


def test_the_relayer_key_reaches_the_spec_and_never_its_repr(tmp_path: Path) -> None:
    relayer = Account.create()
    key_file = tmp_path / "relayer.key"
    key_file.write_text(relayer.key.hex() + "\n# anything after the first line is ignored\n")
    cfg = load_config(
        node={"data_dir": str(tmp_path)}, ledger={**LEDGER, "relayer_key_file": str(key_file)}
    )
    spec = cfg.to_spec(account=Account.create(), hardware=HARDWARE)
    key = spec.ledger.relayer_private_key()
    assert key is not None
    assert Account.from_key(key).address == relayer.address
    assert relayer.key.hex().removeprefix("0x") not in repr(spec)


def test_without_the_option_the_node_pays_its_own_gas(tmp_path: Path) -> None:
    cfg = load_config(node={"data_dir": str(tmp_path)}, ledger=LEDGER)
    spec = cfg.to_spec(account=Account.create(), hardware=HARDWARE)
    assert spec.ledger.relayer_private_key() is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "no such file"), ("", "private key"), ("0x1234\n", "private key"), ("zz" * 32, "key")],
)
def test_a_bad_relayer_key_file_is_named_without_showing_its_content(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    key_file = tmp_path / "relayer.key"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(ConfigError) as caught:  # at load, before any node starts
        load_config(
            node={"data_dir": str(tmp_path)}, ledger={**LEDGER, "relayer_key_file": str(key_file)}
        )
    assert caught.value.field == "ledger.relayer_key_file"
    assert str(key_file) in str(caught.value)
    assert problem in str(caught.value)
    if content:
        assert content.strip() not in str(caught.value)
