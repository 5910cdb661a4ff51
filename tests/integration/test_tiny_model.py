"""The tiny model recipe: deterministic from its seed, cached by key; loading errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.policy.digest import tokenizer_id
from sapo_async.policy.models import build_tiny_model, load_model, tiny_spec

QUICK = {
    "tasks": "cpu_easy",
    "hidden": 32,
    "layers": 1,
    "heads": 2,
    "ffn": 64,
    "warm_steps": 5,
    "warm_batch": 16,
    "warm_eval_questions": 4,
    "warm_eval_samples": 2,
}


def test_same_spec_builds_byte_identical_models_and_another_seed_differs(
    tmp_path: Path, torch_one_thread: None
) -> None:
    spec = tiny_spec("dense", **QUICK)
    build_tiny_model(spec, tmp_path / "a")
    build_tiny_model(spec, tmp_path / "b")
    build_tiny_model(tiny_spec("dense", seed=1, **QUICK), tmp_path / "c")
    weights = [(tmp_path / d / "model.safetensors").read_bytes() for d in "abc"]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]
    tok = [tokenizer_id(load_model(tmp_path / d).tokenizer) for d in "abc"]
    assert tok[0] == tok[1] == tok[2]


def test_spec_key_covers_every_setting() -> None:
    base = tiny_spec("sparse")
    assert base.key() == tiny_spec("sparse").key()
    assert base.key() != tiny_spec("sparse", warm_tagged_fraction=0.5).key()
    assert base.key() != tiny_spec("sparse", hidden=64).key()
    assert base.key() != tiny_spec("dense").key()


def test_unknown_regime_or_setting_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="regime"):
        tiny_spec("medium")
    with pytest.raises(ConfigError, match="setting"):
        tiny_spec("sparse", depth=3)


@pytest.mark.parametrize("name", ["/nonexistent/model", "no-such-org/no-such-model"])
def test_loading_a_missing_model_offline_is_a_config_error(name: str) -> None:
    # tests run with HF_HUB_OFFLINE=1 (tests/conftest.py): nothing reaches the hub
    with pytest.raises(ConfigError) as info:
        load_model(name)
    assert info.value.field == "model"


def test_a_local_model_with_damaged_weights_is_a_one_line_config_error(
    tmp_path: Path, torch_one_thread: None
) -> None:
    build_tiny_model(tiny_spec("dense", **QUICK), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ConfigError) as info:  # was: SafetensorError with a traceback
        load_model(tmp_path / "m")
    assert info.value.field == "model"
    assert "safetensors" in str(info.value)
    assert str(tmp_path / "m") in str(info.value)
    assert "\n" not in str(info.value)
