"""bench/gpu_check.py runs end to end in its CPU smoke mode and writes its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import build_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_gpu_check_cpu_smoke_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    # A subprocess, as a user runs it (the project's trainer phase imports sapo_async
    # inside its function only).
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--cpu-smoke", "--rounds", "2", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu-smoke"
    rounds = report["transformers"]["rounds"]
    assert len(rounds) == 2
    for r in rounds:
        assert r["generated_tokens"] > 0
        assert r["tokens_per_s"] > 0
        assert r["train_step_s"] > 0
        assert r["loss"] == r["loss"]  # not NaN
    assert report["vllm"] == {"skipped": "cpu smoke"}
    trainer = report["trainer"]
    assert trainer["completion_tokens_trained"] == trainer["max_new_tokens"] == 16
    assert trainer["sequences"] == 8
    assert trainer["loss"] == trainer["loss"]


def test_gpu_check_imports_only_torch_transformers_tokenizers_at_top() -> None:
    code = (
        "import sys, runpy; sys.argv=['x']; "
        "import importlib.util as u; spec=u.spec_from_file_location('gc', 'bench/gpu_check.py'); "
        "m=u.module_from_spec(spec); spec.loader.exec_module(m); "
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('sapo_async', 'vllm')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == "[]"


def test_byte_level_tokenizer_round_trips_any_text() -> None:
    tok = build_tokenizer(600)
    text = "Ünïcode 12 + 30 = 42\n\t<answer>42</answer>"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(tok) == 600
    assert tok.decode([599], skip_special_tokens=True)  # filler ids decode to text


@pytest.mark.real_model
def test_the_smollm2_shape_is_the_packaged_models() -> None:
    """--arch smollm2-135m builds the real architecture: its recorded shape is what the
    packaged model's config says (so a GPU machine without the wheel builds the same)."""
    from bench.gpu_check import SMOLLM2_135M_SHAPE, build_model
    from sapo_async.policy.models.packaged import ensure_packaged_model

    config = json.loads((ensure_packaged_model("smollm2-135m") / "config.json").read_text())
    for key, value in SMOLLM2_135M_SHAPE.items():
        real = config["rope_parameters"]["rope_theta"] if key == "rope_theta" else config[key]
        assert real == pytest.approx(value), key
    small = {**SMOLLM2_135M_SHAPE, "num_hidden_layers": 1, "vocab_size": 512}
    assert type(build_model(small, seed=0, family="llama")).__name__ == "LlamaForCausalLM"
