"""Hardware selection: which generation backend, device and default model a node uses.

Owns the decision ``just node`` prints at start-up, and the plain-words reason for it:

* CUDA present and vLLM importable at the pinned version -> vLLM on the GPU;
* CUDA present without (a usable) vLLM -> transformers on the GPU;
* no CUDA -> transformers on the CPU.

The default model follows the memory available: the project's tiny model (``"tiny"``,
built by ``sapo-async warmstart``) on a CPU or a small GPU, Qwen2.5-0.5B-Instruct (the
paper's model) on a GPU with enough memory to train it next to a colocated engine. Every
choice can be overridden; an override that cannot work (vLLM without CUDA) is an error.

Deliberately does not load models or start engines: it only looks (``torch.cuda`` and
``importlib`` metadata, never ``import vllm``, which takes seconds and touches the GPU).
The probes :func:`cuda_info` and :func:`vllm_version` are module functions so tests can
monkeypatch them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Literal

from sapo_async.errors import ConfigError
from sapo_async.limits import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from sapo_async.policy.generation.vllm_api import VLLM_PINNED_VERSION

__all__ = [
    "PAPER_MODEL",
    "TINY_MODEL",
    "BackendName",
    "CudaInfo",
    "HardwareChoice",
    "cuda_info",
    "default_gpu_memory_utilization",
    "default_model",
    "select_backend",
    "vllm_version",
]

BackendName = Literal["vllm", "transformers"]
Requested = Literal["auto", "vllm", "transformers"]

TINY_MODEL = "tiny"
"""The project's own tiny model (built offline by ``sapo-async warmstart``)."""

PAPER_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
"""The model of the SAPO paper's controlled experiments."""

PAPER_MODEL_MIN_GPU_GIB = 16.0
"""Training a 0.5B model (fp32 weights, grads, AdamW: ~8 GB) next to a colocated engine
(weights + KV cache: ~3 GB) plus activations fits in 16 GB; below that, the tiny model."""

_ENGINE_BUDGET_GIB = 6.0
"""What a colocated engine for the 0.5B model needs: ~1 GB bf16 weights, a KV cache for
64 completions of ~800 tokens (~0.6 GB), CUDA graphs and headroom."""


@dataclass(frozen=True, slots=True)
class CudaInfo:
    """The first CUDA device.

    Attributes:
        name: device name, e.g. ``"NVIDIA H200"``.
        total_gib: total device memory in GiB.
        count: number of CUDA devices visible.
    """

    name: str
    total_gib: float
    count: int


@dataclass(frozen=True, slots=True)
class HardwareChoice:
    """What the node will run on, and why.

    Attributes:
        backend: ``"vllm"`` or ``"transformers"``.
        device: ``"cuda"`` or ``"cpu"``.
        model: model name or path (``"tiny"`` means the project's tiny model).
        gpu_memory_utilization: the engine's share of the GPU (vLLM only, else ``None``).
        reason: one plain-English paragraph explaining the choice, for the start-up banner.
        cuda: the CUDA device seen, if any.
        vllm_version: the installed vLLM version, if any.
    """

    backend: BackendName
    device: Literal["cuda", "cpu"]
    model: str
    gpu_memory_utilization: float | None
    reason: str
    cuda: CudaInfo | None
    vllm_version: str | None


def cuda_info() -> CudaInfo | None:
    """The first CUDA device, or ``None`` when torch sees no usable CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return CudaInfo(
        name=str(props.name),
        total_gib=float(props.total_memory) / 2**30,
        count=int(torch.cuda.device_count()),
    )


def vllm_version() -> str | None:
    """The installed vLLM's version, or ``None`` if vLLM is not installed (not imported)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def default_model(cuda: CudaInfo | None) -> str:
    """The default model for the memory available (see the module docstring)."""
    if cuda is not None and cuda.total_gib >= PAPER_MODEL_MIN_GPU_GIB:
        return PAPER_MODEL
    return TINY_MODEL


def default_gpu_memory_utilization(cuda: CudaInfo) -> float:
    """A colocated engine's GPU share: a fixed budget of ~6 GiB, between 10 % and 50 %."""
    if cuda.total_gib <= 0:
        return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    return round(min(0.5, max(0.1, _ENGINE_BUDGET_GIB / cuda.total_gib)), 3)


def select_backend(
    requested: Requested | str = "auto",
    *,
    model: str | None = None,
    device: str | None = None,
    gpu_memory_utilization: float | None = None,
) -> HardwareChoice:
    """Choose the generation backend, device and model for this machine.

    Args:
        requested: ``"auto"`` (follow the rules in the module docstring), ``"vllm"`` or
            ``"transformers"``.
        model: override the default model (name or path).
        device: override the device for the transformers backend (``"cpu"``/``"cuda"``).
        gpu_memory_utilization: override the vLLM engine's GPU share.

    Returns:
        The :class:`HardwareChoice`, with its reason in plain words.

    Raises:
        ConfigError: an unknown backend or device, or an override that cannot work here
            (vLLM or CUDA without a CUDA device, vLLM not installed, vLLM on the CPU).
    """
    if requested not in ("auto", "vllm", "transformers"):
        raise ConfigError(
            f"backend must be 'auto', 'vllm' or 'transformers', got {requested!r}",
            field="model.backend",
        )
    if device is not None and device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'cpu' or 'cuda', got {device!r}", field="model.device")
    cuda = cuda_info()
    version = vllm_version()
    chosen_model = model or default_model(cuda)
    model_why = (
        f"model {chosen_model!r} as configured"
        if model
        else _default_model_reason(cuda, chosen_model)
    )

    if cuda is None:
        if requested == "vllm" or device == "cuda":
            what = "the vLLM backend" if requested == "vllm" else "device 'cuda'"
            raise ConfigError(
                f"{what} was requested but torch sees no CUDA device",
                field="model.backend" if requested == "vllm" else "model.device",
            )
        why = "No CUDA device is visible to torch, so generation runs with transformers on the CPU"
        if version is not None:
            why += f" (vLLM {version} is installed but needs a GPU)"
        return HardwareChoice(
            "transformers", "cpu", chosen_model, None, f"{why}; {model_why}.", None, version
        )

    gpu = f"{cuda.name} with {cuda.total_gib:.0f} GiB"
    vllm_usable = version == VLLM_PINNED_VERSION
    if requested == "vllm" and device == "cpu":
        raise ConfigError(
            "the vLLM backend runs on CUDA only; drop device='cpu'", field="model.device"
        )
    if requested == "vllm" and not vllm_usable:
        raise ConfigError(_vllm_missing(version), field="model.backend")
    if requested == "transformers" or device == "cpu" or not vllm_usable:
        dev: Literal["cuda", "cpu"] = "cpu" if device == "cpu" else "cuda"
        if requested == "transformers":
            why = f"The transformers backend was requested; it runs on {dev} ({gpu} found)"
        elif device == "cpu":
            why = f"Device 'cpu' was requested, so transformers runs on the CPU ({gpu} unused)"
        else:
            why = (
                f"A CUDA GPU ({gpu}) is present but {_vllm_missing(version)}, "
                "so generation runs with transformers on the GPU"
            )
        return HardwareChoice(
            "transformers", dev, chosen_model, None, f"{why}; {model_why}.", cuda, version
        )

    share = gpu_memory_utilization or default_gpu_memory_utilization(cuda)
    why = (
        f"A CUDA GPU ({gpu}) and vLLM {version} are present, so generation runs on a vLLM "
        f"engine colocated with the trainer on the same GPU, using {share:.0%} of its memory "
        "(weights are synced into it in memory after every optimizer step and checked by a "
        "log-prob probe)"
    )
    return HardwareChoice(
        "vllm", "cuda", chosen_model, share, f"{why}; {model_why}.", cuda, version
    )


def _vllm_missing(version: str | None) -> str:
    if version is None:
        return (
            f"vLLM is not installed (pip install 'sapo_async[gpu]' for vllm=={VLLM_PINNED_VERSION})"
        )
    return (
        f"the installed vLLM is {version}, not the {VLLM_PINNED_VERSION} this backend was "
        "written against"
    )


def _default_model_reason(cuda: CudaInfo | None, chosen: str) -> str:
    if chosen == PAPER_MODEL and cuda is not None:
        return (
            f"default model {chosen} (the paper's), since {cuda.total_gib:.0f} GiB >= "
            f"{PAPER_MODEL_MIN_GPU_GIB:.0f} GiB fits training it"
        )
    if cuda is None:
        return f"default model {chosen!r} (the project's tiny model), the one that trains on a CPU"
    return (
        f"default model {chosen!r} (the project's tiny model), since {cuda.total_gib:.0f} GiB "
        f"< {PAPER_MODEL_MIN_GPU_GIB:.0f} GiB is too little to train {PAPER_MODEL}"
    )
