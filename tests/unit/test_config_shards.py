"""`[nats] shards`, `shards_read` and `shard_rotate_s`: read, validated, and carried
to the node's collector (the key existed before and nothing read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.fabric.transport.shards import ShardPlan
from sapo_async.node.spec import FabricSpec
from sapo_async.ops.config import load_config
from sapo_async.ops.doctor import check_shards


@pytest.fixture(autouse=True)
def _clean_sapo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SAPO_"):
            monkeypatch.delenv(name)


def _spec_fabric(cfg) -> FabricSpec:  # type: ignore[no-untyped-def]
    from eth_account import Account

    from sapo_async.ops.hardware import HardwareChoice

    hardware = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
    return cfg.to_spec(account=Account.create(), hardware=hardware).fabric


def test_shard_settings_reach_the_node_spec_and_its_plan(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("[nats]\nshards = 256\nshards_read = 10\nshard_rotate_s = 120\n")
    fabric = _spec_fabric(load_config(path))
    assert (fabric.shards, fabric.shards_read, fabric.shard_rotate_s) == (256, 10, 120.0)
    assert fabric.shard_plan() == ShardPlan(256, 10, 120.0)


def test_defaults_read_the_whole_swarm() -> None:
    fabric = _spec_fabric(load_config())
    assert fabric.shard_plan() is None
    assert "whole swarm" in check_shards(load_config()).detail


def test_shards_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAPO_NATS__SHARDS", "16")
    monkeypatch.setenv("SAPO_NATS__SHARDS_READ", "3")
    cfg = load_config()
    assert (cfg.nats.shards, cfg.nats.shards_read) == (16, 3)
    check = check_shards(cfg)
    assert check.status == "ok"
    assert "reads 3 of 16 shards" in check.detail


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[nats]\nshards = 8\n", "4096"),
        ("[nats]\nshards_read = 2\n", "shards_read = 2 is more than shards = 1"),
        ("[nats]\nshards = 16\nshards_read = 17\n", "read 1..16"),
        ("[nats]\nshards = 16\nshards_read = 0\n", "1"),
        ("[nats]\nshard_rotate_s = 0\n", "greater than 0"),
    ],
)
def test_bad_shard_settings_are_one_line_errors_naming_nats(
    tmp_path: Path, toml: str, says: str
) -> None:
    path = tmp_path / "node.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field is not None
    assert info.value.field.startswith("nats")
    assert says in str(info.value)


def test_fabric_spec_refuses_an_impossible_plan() -> None:
    with pytest.raises(ConfigError, match=r"shards_read = 5 is more than shards = 1") as info:
        FabricSpec(shards_read=5)
    assert info.value.field == "fabric.shards_read"
    with pytest.raises(ConfigError, match=r"fabric\.shards = 3: must be 1, 16, 256 or 4096"):
        FabricSpec(shards=3)


def test_stream_replicas_reach_the_node(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("[nats]\nstream_replicas = 3\n")
    assert _spec_fabric(load_config(path)).stream_replicas == 3
