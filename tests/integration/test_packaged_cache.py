"""The real SmolLM2 cache damaged or interrupted (issue 55, item 3): a prepared directory cut
in half is moved aside and prepared again from the wheel, and SIGTERM during a real
preparation leaves nothing in the cache and says so. Each test uses its own cache root;
the volunteer's own prepared copy is only read (copied from) and never changed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sapo_async.policy.models import load_model
from sapo_async.policy.models.packaged import cache_root, packaged_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SMOL = "smollm2-135m"


@pytest.mark.timeout(900)
def test_a_smollm2_cache_cut_in_half_is_prepared_again_from_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    final = packaged_model_dir(SMOL, cache)
    final.mkdir(parents=True)
    source = packaged_model_dir(SMOL, cache_root())
    if (source / "sapo-packaged.json").is_file():  # copy what we need: the weights halved
        for path in source.iterdir():
            if path.name != "model.safetensors":
                shutil.copy2(path, final / path.name)
        with (source / "model.safetensors").open("rb") as whole:
            half = whole.read((source / "model.safetensors").stat().st_size // 2)
        (final / "model.safetensors").write_bytes(half)
    else:  # no prepared copy here: a config cut off before the weights were written
        (final / "config.json").write_text('{"model_type": "llama"}')
        (final / "sapo-packaged.json").write_text(json.dumps({"name": SMOL}))
    monkeypatch.setenv("SAPO_CACHE_DIR", str(cache))
    loaded = load_model(SMOL)  # was: SafetensorError with a traceback
    assert loaded.path == final
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    assert (final.parent / f"{final.name}.damaged-1" / "model.safetensors").is_file() or (
        final.parent / f"{final.name}.damaged-1" / "config.json"
    ).is_file()
    marker = json.loads((final / "sapo-packaged.json").read_text())
    assert (
        marker["files"]["model.safetensors"]["size"] == (final / "model.safetensors").stat().st_size
    )
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.timeout(300)
def test_sigterm_during_a_real_smollm2_preparation_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SAPO_CACHE_DIR", None)
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sapo_async",
            "warmstart",
            "--models",
            SMOL,
            "--cache-dir",
            str(cache),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        assert child.stderr is not None
        seen: list[str] = []
        for line in child.stderr:
            seen.append(line)
            if "model_preparing" in line:
                break
        else:
            pytest.fail("no model_preparing line: " + "".join(seen))
        time.sleep(1.0)  # inside the preparation: checking the GGUF or dequantising it
        child.send_signal(signal.SIGTERM)
        started = time.monotonic()
        rest = child.stderr.read()
        child.wait(timeout=60)
        assert time.monotonic() - started < 30
    err = "".join(seen) + rest
    assert child.returncode == -signal.SIGTERM, err
    assert not list((cache / "models").iterdir()), "the temporary directory was left behind"
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert len(said) == 1, err
    assert "SIGTERM" in said[0]
    assert "Traceback" not in err
