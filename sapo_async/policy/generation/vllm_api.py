"""The vLLM 0.33.0 surface the vLLM backend uses: names, settings, parameter mapping, shims.

Owns everything the backend needs to know about vLLM's API apart from driving the engine:
the lazily imported names (:class:`VllmApi`, the seam where tests put a fake), the engine
settings and the ``vllm.LLM`` keyword arguments they become, the mapping of the node's
sampling parameters onto ``vllm.SamplingParams`` and of vLLM's ``RequestOutput`` back onto
the port's :class:`~sapo_async.policy.generation.base.GenerationResult`. The weight-transfer
shims live in :mod:`.vllm_weights`. Importing this module never imports vLLM or torch.

Signatures mirrored (read from the vllm==0.33.0 wheel; recorded in
tests/unit/data/vllm_0_33_0_signatures.json and checked against the fake):
``LLM(model, *, dtype, seed, gpu_memory_utilization, enforce_eager, **engine_args)``,
``LLM.generate(prompts, sampling_params, *, use_tqdm, ...)``, ``LLM.sleep(level, mode)``,
``LLM.wake_up(tags)``, ``LLM.reset_prefix_cache(...)``, ``LLM.init_weight_transfer_engine
(request)``, ``LLM.start_weight_update()``, ``LLM.update_weights(request)``,
``LLM.finish_weight_update(weight_version)``, ``LLM.update_weight_version(new_version)``,
``SamplingParams(n, temperature, top_p, top_k, seed, max_tokens, logprobs,
prompt_logprobs)``, ``IPCTrainerInitInfo(packed, packed_buffer_size_bytes, *, rank)``,
``IPCTrainerWeightTransferEngine.trainer_init(init_info, *, client, source)`` and
``.send_weights()``, ``ParamMeta(name, dtype, shape)``, ``WeightSource.iter_full()``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sapo_async.errors import ConfigError, GenerationError
from sapo_async.limits import PROBE_MAX_LOGPROB_DIFF, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from sapo_async.logs import get_logger
from sapo_async.policy.generation.base import GenerationResult, check_sampling
from sapo_async.wire import Completion, SamplingParams

if TYPE_CHECKING:  # pragma: no cover - typing only
    pass

__all__ = [
    "VLLM_PINNED_VERSION",
    "SleepLevel",
    "VllmApi",
    "VllmSettings",
    "from_request_output",
    "load_vllm_api",
    "prompt_seed",
    "to_vllm_sampling_params",
]

_log = get_logger("generation.vllm")

VLLM_PINNED_VERSION = "0.33.0"
"""The vLLM version this adapter's calls were read from (pinned in the ``gpu`` extra)."""
SleepLevel = Literal[0, 1, 2]


@dataclass(frozen=True, slots=True)
class VllmApi:
    """The vLLM 0.33.0 names this backend uses: the seam where tests put a fake.

    Attributes:
        version: ``vllm.__version__``.
        LLM: ``vllm.LLM``.
        SamplingParams: ``vllm.SamplingParams``.
        TokensPrompt: ``vllm.inputs.TokensPrompt``.
        WeightSource: ``vllm.distributed.weight_transfer.base.WeightSource``.
        ParamMeta: ``vllm.distributed.weight_transfer.base.ParamMeta``.
        IPCTrainerInitInfo: ``vllm.distributed.weight_transfer.ipc_engine.IPCTrainerInitInfo``.
        IPCTrainerWeightTransferEngine: the trainer side of the CUDA-IPC transfer
            (``...ipc_engine.IPCTrainerWeightTransferEngine``).
    """

    version: str
    LLM: Any
    SamplingParams: Any
    TokensPrompt: Any
    WeightSource: Any
    ParamMeta: Any
    IPCTrainerInitInfo: Any
    IPCTrainerWeightTransferEngine: Any


def load_vllm_api() -> VllmApi:
    """Import vLLM and return the names the backend uses.

    Returns:
        The real :class:`VllmApi`. A version other than :data:`VLLM_PINNED_VERSION` is
        logged as a warning (the adapter may not match it).

    Raises:
        GenerationError: vLLM is not installed or fails to import.
    """
    try:
        import vllm
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerInitInfo,
            IPCTrainerWeightTransferEngine,
        )
        from vllm.inputs import TokensPrompt
    except ImportError as exc:
        raise GenerationError(
            f"vLLM is not importable ({exc}); install the GPU extra: "
            f"pip install 'sapo_async[gpu]' (vllm=={VLLM_PINNED_VERSION}, needs a CUDA GPU)"
        ) from exc
    version = str(getattr(vllm, "__version__", "unknown"))
    if version != VLLM_PINNED_VERSION:
        _log.warning("vllm_version_unpinned", found=version, pinned=VLLM_PINNED_VERSION)
    return VllmApi(
        version=version,
        LLM=vllm.LLM,
        SamplingParams=vllm.SamplingParams,
        TokensPrompt=TokensPrompt,
        WeightSource=WeightSource,
        ParamMeta=ParamMeta,
        IPCTrainerInitInfo=IPCTrainerInitInfo,
        IPCTrainerWeightTransferEngine=IPCTrainerWeightTransferEngine,
    )


@dataclass(frozen=True, slots=True)
class VllmSettings:
    """How to start the engine.

    Attributes:
        model: local directory or hub id of the model (the same weights the trainer starts
            from: syncs only replace tensors, never the architecture).
        gpu_memory_utilization: fraction of the whole GPU the engine may use for weights,
            activations and KV cache, in (0, 1); the colocated trainer gets the rest.
        dtype: engine dtype (``"auto"``, ``"bfloat16"``, ``"float16"``, ``"float32"``).
        sleep_level: 0 never sleeps; 1 offloads weights to CPU and drops the KV cache
            around each training step; 2 drops weights too (a full reload on wake).
        seed: engine seed.
        max_model_len: context cap (prompt + completion); ``None`` takes the model's.
        enforce_eager: skip CUDA-graph capture (faster start, slower decode).
        probe_threshold: allowed mean |delta log-prob| after a sync.
        engine_kwargs: further keyword arguments for ``vllm.LLM`` (``EngineArgs`` fields).
    """

    model: str
    gpu_memory_utilization: float = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    dtype: str = "bfloat16"
    sleep_level: SleepLevel = 0
    seed: int = 0
    max_model_len: int | None = None
    enforce_eager: bool = False
    probe_threshold: float = PROBE_MAX_LOGPROB_DIFF
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must name a directory or hub id", field="model.name_or_path")
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1), got {self.gpu_memory_utilization}",
                field="model.gpu_memory_utilization",
            )
        if self.sleep_level not in (0, 1, 2):
            raise ConfigError(
                f"sleep_level must be 0, 1 or 2, got {self.sleep_level!r}",
                field="model.sleep_mode",
            )
        if not self.probe_threshold > 0:
            raise ConfigError(
                f"probe_threshold must be > 0, got {self.probe_threshold}", field="probe_threshold"
            )
        reserved = {"model", "weight_transfer_config", "enable_sleep_mode"} & set(
            self.engine_kwargs
        )
        if reserved:
            raise ConfigError(
                f"engine_kwargs may not set {sorted(reserved)}: the backend owns them",
                field="engine_kwargs",
            )

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (0.33.0)."""
        kwargs: dict[str, Any] = {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "dtype": self.dtype,
            "seed": self.seed,
            "enforce_eager": self.enforce_eager,
            # EngineArgs fields, passed through LLM(**kwargs):
            "enable_sleep_mode": self.sleep_level > 0,
            "weight_transfer_config": {"backend": "ipc"},
        }
        if self.max_model_len is not None:
            kwargs["max_model_len"] = self.max_model_len
        kwargs.update(self.engine_kwargs)
        return kwargs


def to_vllm_sampling_params(
    api: VllmApi, sampling: SamplingParams, *, n: int, seed: int | None
) -> Any:
    """Map the node's sampling parameters onto ``vllm.SamplingParams`` (0.33.0).

    ``top_k = 0`` means "off" on both sides in 0.33.0 (vLLM also accepts -1). ``logprobs=0``
    asks for the sampled token's log-prob only; vLLM's default ``logprobs_mode`` is
    ``raw_logprobs`` (temperature-1 log-softmax), which is the port's invariant.

    Raises:
        ConfigError: ``n`` < 1 or a parameter outside its range.
    """
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}", field="training.completions_per_question")
    check_sampling(sampling, prefix="training")
    return api.SamplingParams(
        n=n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_new_tokens,
        seed=seed,
        logprobs=0,
    )


def prompt_seed(seed: int | None, index: int) -> int | None:
    # Hash rather than seed + index: (seed s, prompt i+1) must not equal (seed s+1, prompt i).
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def from_request_output(prompt: str, output: Any, n: int) -> GenerationResult:
    """A vLLM ``RequestOutput`` as the port's :class:`GenerationResult`.

    Args:
        prompt: the prompt text the output answers.
        output: the ``RequestOutput`` (``logprobs=0`` requested: one entry per token).
        n: completions requested.

    Returns:
        The result, completions in vLLM's index order.

    Raises:
        GenerationError: not ``n`` completions, a finish reason other than stop/length, or
            a sampled token without its log-prob.
    """
    completions = sorted(output.outputs, key=lambda c: c.index)
    if len(completions) != n:
        raise GenerationError(f"vLLM returned {len(completions)} completions, expected {n}")
    converted: list[Completion] = []
    for c in completions:
        if c.finish_reason not in ("stop", "length"):
            raise GenerationError(
                f"vLLM finished a completion with {c.finish_reason!r} (stop reason "
                f"{c.stop_reason!r})"
            )
        ids = tuple(int(t) for t in c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise GenerationError("vLLM returned no log-prob per sampled token")
        logprobs = tuple(
            float(position[token].logprob) for position, token in zip(c.logprobs, ids, strict=True)
        )
        converted.append(
            Completion(text=c.text, finish_reason=c.finish_reason, token_ids=ids, logprobs=logprobs)
        )
    return GenerationResult(
        prompt=prompt,
        prompt_token_ids=tuple(int(t) for t in (output.prompt_token_ids or ())),
        completions=tuple(converted),
    )
