"""examples/gpu_node.toml parses, carries the paper's settings, and selects a backend."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sapo_async.ops import hardware
from sapo_async.ops.hardware import CudaInfo, select_backend
from sapo_async.policy.generation.vllm_api import VllmSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpu_node.toml"
PAPER_FAMILIES = {
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
}


def load() -> dict[str, dict[str, object]]:
    return tomllib.loads(EXAMPLE.read_text())


def test_gpu_example_has_the_papers_settings() -> None:
    cfg = load()
    assert cfg["model"]["name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert set(cfg["tasks"]["families"]) == PAPER_FAMILIES  # type: ignore[arg-type]
    training = cfg["training"]
    assert (training["questions_per_round"], training["completions_per_question"]) == (8, 8)
    assert training["local"] + training["external"] == 8  # type: ignore[operator]
    assert (training["clip_low"], training["clip_high"], training["kl_beta"]) == (0.2, 0.28, 0.0)


def test_gpu_example_model_section_builds_engine_settings() -> None:
    model = load()["model"]
    settings = VllmSettings(
        model=str(model["name_or_path"]),
        gpu_memory_utilization=float(model["gpu_memory_utilization"]),  # type: ignore[arg-type]
        sleep_level=model["sleep_mode"],  # type: ignore[arg-type]
    )
    assert settings.llm_kwargs()["enable_sleep_mode"] is True


@pytest.mark.parametrize(
    ("cuda", "vllm", "backend"),
    [
        (CudaInfo("NVIDIA H200", 139.8, 1), "0.33.0", "vllm"),
        (CudaInfo("NVIDIA H200", 139.8, 1), None, "transformers"),
    ],
)
def test_gpu_example_selects_a_backend(
    monkeypatch: pytest.MonkeyPatch, cuda: CudaInfo, vllm: str | None, backend: str
) -> None:
    monkeypatch.setattr(hardware, "cuda_info", lambda: cuda)
    monkeypatch.setattr(hardware, "vllm_version", lambda: vllm)
    model = load()["model"]
    choice = select_backend(
        str(model["backend"]),
        model=str(model["name_or_path"]),
        device=str(model["device"]),
        gpu_memory_utilization=float(model["gpu_memory_utilization"]),  # type: ignore[arg-type]
    )
    assert choice.backend == backend
    assert choice.model == "Qwen/Qwen2.5-0.5B-Instruct"
