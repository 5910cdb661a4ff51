"""The node keystore: created once, encrypted, opened with a password from env, file or prompt."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from eth_account import Account
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import ConfigError, IdentityError
from sapo_async.ops.config import NodeConfig, load_config
from sapo_async.ops.identity import load_or_create_identity

FAST_N = 16  # scrypt cost for tests only; real keystores use limits.KEYSTORE_SCRYPT_N


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeConfig:
    monkeypatch.delenv("SAPO_KEY_PASSWORD", raising=False)
    return load_config(node={"data_dir": str(tmp_path / "data")})


def test_first_run_creates_an_encrypted_keystore_and_later_runs_reopen_it(
    cfg: NodeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "correct horse")
    first = load_or_create_identity(cfg, scrypt_n=FAST_N)
    path = cfg.keystore_path
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keystore = json.loads(path.read_text())
    assert keystore["crypto"]["kdf"] == "scrypt"
    assert first.key.hex() not in path.read_text()
    assert keystore["address"].lower() == first.address[2:].lower()
    again = load_or_create_identity(cfg, scrypt_n=FAST_N)
    assert again.address == first.address
    assert again.key == first.key


def test_wrong_password_is_an_identity_error_and_keeps_the_file(
    cfg: NodeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "right")
    load_or_create_identity(cfg, scrypt_n=FAST_N)
    before = cfg.keystore_path.read_bytes()
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "wrong")
    with pytest.raises(IdentityError, match="wrong password"):
        load_or_create_identity(cfg, scrypt_n=FAST_N)
    assert cfg.keystore_path.read_bytes() == before


def test_password_file_is_used_when_the_variable_is_unset(tmp_path: Path) -> None:
    secret = tmp_path / "pw.txt"
    secret.write_text("from-file\nignored second line\n")
    cfg = load_config(
        node={"data_dir": str(tmp_path / "d")},
        identity={"password_file": str(secret), "password_env": "SAPO_TEST_UNSET_PW"},
    )
    account = load_or_create_identity(cfg, scrypt_n=FAST_N, interactive=False)
    key = Account.decrypt(json.loads(cfg.keystore_path.read_text()), "from-file")
    assert Account.from_key(key).address == account.address


def test_environment_variable_wins_over_password_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "pw.txt"
    secret.write_text("from-file\n")
    monkeypatch.setenv("MY_PW", "from-env")
    cfg = load_config(
        node={"data_dir": str(tmp_path / "d")},
        identity={"password_file": str(secret), "password_env": "MY_PW"},
    )
    load_or_create_identity(cfg, scrypt_n=FAST_N)
    Account.decrypt(json.loads(cfg.keystore_path.read_text()), "from-env")


def test_prompt_asks_twice_on_creation_and_once_on_open(cfg: NodeConfig) -> None:
    asked: list[str] = []

    def prompt(text: str) -> str:
        asked.append(text)
        return "typed"

    created = load_or_create_identity(cfg, prompt=prompt, interactive=True, scrypt_n=FAST_N)
    assert len(asked) == 2
    opened = load_or_create_identity(cfg, prompt=prompt, interactive=True, scrypt_n=FAST_N)
    assert len(asked) == 3
    assert opened.address == created.address


def test_mismatched_prompted_passwords_write_nothing(cfg: NodeConfig) -> None:
    answers = iter(["one", "two"])
    with pytest.raises(IdentityError, match="differ"):
        load_or_create_identity(
            cfg, prompt=lambda _: next(answers), interactive=True, scrypt_n=FAST_N
        )
    assert not cfg.keystore_path.exists()


def test_no_password_source_and_no_terminal_says_what_to_set(cfg: NodeConfig) -> None:
    with pytest.raises(IdentityError, match=r"SAPO_KEY_PASSWORD.*password_file") as info:
        load_or_create_identity(cfg, interactive=False, scrypt_n=FAST_N)
    assert isinstance(info.value, ConfigError)
    assert not cfg.keystore_path.exists()


def test_empty_password_file_is_rejected(tmp_path: Path) -> None:
    secret = tmp_path / "pw.txt"
    secret.write_text("")
    cfg = load_config(
        node={"data_dir": str(tmp_path)},
        identity={"password_file": str(secret), "password_env": "SAPO_TEST_UNSET_PW"},
    )
    with pytest.raises(IdentityError, match="empty") as info:
        load_or_create_identity(cfg, scrypt_n=FAST_N)
    assert info.value.field == "identity.password_file"


def test_corrupt_keystore_is_reported_not_replaced(
    cfg: NodeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "pw")
    cfg.keystore_path.parent.mkdir(parents=True)
    cfg.keystore_path.write_text("{not json")
    with pytest.raises(IdentityError, match="is damaged \\(not JSON"):
        load_or_create_identity(cfg, scrypt_n=FAST_N)
    assert cfg.keystore_path.read_text() == "{not json"


def test_identity_command_prints_the_address_of_the_keystore(
    cfg: NodeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "pw")
    account = load_or_create_identity(cfg, scrypt_n=FAST_N)  # cheap keystore to open
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\ndata_dir = "{cfg.node.data_dir}"\n')
    result = CliRunner().invoke(build_app(), ["identity", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert f"node address {account.address}" in result.output
    monkeypatch.delenv("SAPO_KEY_PASSWORD")
    result = CliRunner().invoke(build_app(), ["identity", "--config", str(path)])
    assert result.exit_code == 1
    assert "SAPO_KEY_PASSWORD" in result.output


def _damaged(good: str) -> dict[str, bytes]:
    keystore = json.loads(good)
    crypto = keystore["crypto"]
    flipped = bytearray(good.encode())
    at = good.index(crypto["ciphertext"]) + 3
    flipped[at] = ord("0") if flipped[at] != ord("0") else ord("1")
    return {
        "truncated": good[: len(good) // 2].encode(),
        "empty": b"",
        "random bytes": bytes(range(256)),
        "empty object": b"{}",
        "a list": b"[]",
        "no crypto": json.dumps({"version": 3}).encode(),
        "empty crypto": json.dumps({**keystore, "crypto": {}}).encode(),
        "version 4": json.dumps({**keystore, "version": 4}).encode(),
        "unknown kdf": json.dumps({**keystore, "crypto": {**crypto, "kdf": "foo"}}).encode(),
        "null kdfparams": json.dumps(
            {**keystore, "crypto": {**crypto, "kdfparams": None}}
        ).encode(),
        "flipped ciphertext byte": bytes(flipped),
    }


DAMAGE = list(_damaged(json.dumps({"version": 3, "crypto": {"ciphertext": "00" * 8}})))


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_keystore_is_named_with_what_to_do_and_left_as_it_was(
    cfg: NodeConfig, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    # Most of these raised KeyError or TypeError from eth-keyfile (a traceback).
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "pw")
    load_or_create_identity(cfg, scrypt_n=FAST_N)
    data = _damaged(cfg.keystore_path.read_text())[damage]
    cfg.keystore_path.write_bytes(data)
    with pytest.raises(IdentityError) as caught:
        load_or_create_identity(cfg, scrypt_n=FAST_N)
    message = str(caught.value)
    assert str(cfg.keystore_path) in message
    assert "\n" not in message
    if damage == "flipped ciphertext byte":  # only the MAC can tell: it reads as a wrong password
        assert "wrong password" in message
        assert "altered" in message
    else:
        assert "restore it from your backup" in message
    assert cfg.keystore_path.read_bytes() == data
    assert sorted(p.name for p in cfg.keystore_path.parent.iterdir()) == ["key.json"]


def test_identity_prints_the_address_before_any_contract_exists(
    cfg: NodeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A volunteer needs the address to be funded before the contract is deployed; identity
    # refused a config with ledger.rpc_url but no ledger.contract_address.
    monkeypatch.setenv("SAPO_KEY_PASSWORD", "pw")
    account = load_or_create_identity(cfg, scrypt_n=FAST_N)
    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\ndata_dir = "{cfg.node.data_dir}"\n[ledger]\nrpc_url = "http://127.0.0.1:8545"\n'
    )
    result = CliRunner().invoke(build_app(), ["identity", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert f"node address {account.address}" in result.output
