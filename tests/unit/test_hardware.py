"""Hardware selection with monkeypatched probes of CUDA and vLLM."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import ConfigError
from sapo_async.ops import hardware
from sapo_async.ops.hardware import PAPER_MODEL, TINY_MODEL, CudaInfo, select_backend

H200 = CudaInfo(name="NVIDIA H200", total_gib=139.8, count=1)
T4 = CudaInfo(name="Tesla T4", total_gib=15.0, count=1)
PINNED = "0.33.0"


SetMachine = Callable[[CudaInfo | None, str | None], None]


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> SetMachine:
    def set_machine(cuda: CudaInfo | None, vllm: str | None) -> None:
        monkeypatch.setattr(hardware, "cuda_info", lambda: cuda)
        monkeypatch.setattr(hardware, "vllm_version", lambda: vllm)

    return set_machine


def test_cuda_and_vllm_choose_a_colocated_vllm_engine(machine: SetMachine) -> None:
    machine(H200, PINNED)
    choice = select_backend()
    assert (choice.backend, choice.device, choice.model) == ("vllm", "cuda", PAPER_MODEL)
    assert choice.gpu_memory_utilization == pytest.approx(0.1)
    assert "vLLM 0.33.0" in choice.reason
    assert "NVIDIA H200" in choice.reason
    assert "colocated" in choice.reason


def test_cuda_without_vllm_chooses_transformers_on_the_gpu(machine: SetMachine) -> None:
    machine(H200, None)
    choice = select_backend()
    assert (choice.backend, choice.device) == ("transformers", "cuda")
    assert "not installed" in choice.reason
    assert choice.gpu_memory_utilization is None


def test_cuda_with_another_vllm_version_falls_back_to_transformers(machine: SetMachine) -> None:
    machine(H200, "0.9.1")
    choice = select_backend()
    assert (choice.backend, choice.device) == ("transformers", "cuda")
    assert "0.9.1" in choice.reason
    assert "0.33.0" in choice.reason


def test_no_cuda_chooses_transformers_on_the_cpu_with_the_tiny_model(machine: SetMachine) -> None:
    machine(None, None)
    choice = select_backend()
    assert (choice.backend, choice.device, choice.model) == ("transformers", "cpu", TINY_MODEL)
    assert "No CUDA device" in choice.reason


def test_no_cuda_mentions_an_installed_but_unusable_vllm(machine: SetMachine) -> None:
    machine(None, PINNED)
    choice = select_backend()
    assert choice.backend == "transformers"
    assert "needs a GPU" in choice.reason


def test_small_gpu_defaults_to_the_tiny_model(machine: SetMachine) -> None:
    machine(T4, PINNED)
    choice = select_backend()
    assert (choice.backend, choice.model) == ("vllm", TINY_MODEL)
    assert "too little" in choice.reason
    assert choice.gpu_memory_utilization == pytest.approx(0.4)


def test_model_and_memory_share_can_be_overridden(machine: SetMachine) -> None:
    machine(H200, PINNED)
    choice = select_backend(model="/models/mine", gpu_memory_utilization=0.45)
    assert choice.model == "/models/mine"
    assert choice.gpu_memory_utilization == 0.45
    assert "as configured" in choice.reason


def test_transformers_can_be_requested_on_a_vllm_machine(machine: SetMachine) -> None:
    machine(H200, PINNED)
    choice = select_backend("transformers")
    assert (choice.backend, choice.device) == ("transformers", "cuda")
    assert "requested" in choice.reason


def test_cpu_can_be_requested_on_a_gpu_machine(machine: SetMachine) -> None:
    machine(H200, PINNED)
    choice = select_backend(device="cpu")
    assert (choice.backend, choice.device) == ("transformers", "cpu")


@pytest.mark.parametrize(
    ("cuda", "vllm", "kwargs", "field"),
    [
        (None, PINNED, {"requested": "vllm"}, "model.backend"),
        (None, None, {"device": "cuda"}, "model.device"),
        (H200, None, {"requested": "vllm"}, "model.backend"),
        (H200, PINNED, {"requested": "vllm", "device": "cpu"}, "model.device"),
        (H200, PINNED, {"requested": "tensorrt"}, "model.backend"),
        (H200, PINNED, {"device": "tpu"}, "model.device"),
    ],
)
def test_impossible_requests_are_errors_naming_the_field(
    machine: SetMachine, cuda: CudaInfo | None, vllm: str | None, kwargs: dict[str, str], field: str
) -> None:
    machine(cuda, vllm)
    with pytest.raises(ConfigError) as caught:
        select_backend(**kwargs)
    assert caught.value.field == field


def test_real_probes_run_on_this_machine() -> None:
    # No monkeypatching: the probes themselves work (here: no CUDA, no vLLM in CI).
    info = hardware.cuda_info()
    assert info is None or info.total_gib > 0
    version = hardware.vllm_version()
    assert version is None or isinstance(version, str)
    assert select_backend().reason


def test_hardware_command_prints_the_choice_and_reason(machine: SetMachine) -> None:
    machine(H200, PINNED)
    result = CliRunner().invoke(build_app(), ["hardware", "--json"])
    assert result.exit_code == 0, result.output
    assert '"backend": "vllm"' in result.output

    machine(None, None)
    result = CliRunner().invoke(build_app(), ["hardware", "--backend", "vllm"])
    assert result.exit_code == 2
