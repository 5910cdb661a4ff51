"""A CPU fake of the vLLM 0.33.0 surface the vLLM backend uses (the test seam).

Every class and method here mirrors the real one's name and call signature, read from the
vllm==0.33.0 wheel (files named beside each class); ``test_fake_vllm_signatures`` checks
them against the real vLLM whenever it is importable. Behind the signatures runs a real
transformers causal LM on CPU, so generation, prompt log-probs and weight loads are real
torch computations, and the failure modes the backend must survive can be switched on:

* sleep level 1 offloads the weights (kept, restored on wake); level 2 discards them (the
  region comes back holding garbage until weights are loaded again), as in vLLM;
* ``drop_weight_updates`` makes weight updates succeed without changing the model (the
  "silently not synced" bug reported in TRL and verl);
* requests while asleep, or weight updates out of order, raise as the real worker does.

The weight transfer mirrors the CUDA-IPC backend's control flow (``trainer_init`` ->
``init_weight_transfer_engine``; ``send_weights`` -> start / update / finish); the "IPC
handle" is the tensor itself, since there is no second process or CUDA device here.
"""

from __future__ import annotations

import functools
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NotRequired, TypedDict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from bench.gpu_check import build_tokenizer
from sapo_async.policy.generation.vllm_api import VllmApi

VERSION = "0.33.0"
_PACKED_DEFAULT = 1024 * 1024 * 1024  # packed_tensor.DEFAULT_PACKED_BUFFER_SIZE_BYTES


# --- tiny real models for the fake engine and the trainer ---------------------------------

TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "vocab_size": 300,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}


def tiny_causal_lm(*, seed: int) -> Qwen2ForCausalLM:
    """A randomly initialised tiny Qwen2 causal LM (float32, CPU, eval mode)."""
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**TINY_SHAPE)).eval()


def save_tiny_checkpoint(path: Path, *, seed: int = 0) -> Path:
    """Write a tiny model + byte-level tokenizer directory, as ``LLM(model=path)`` takes."""
    path.mkdir(parents=True, exist_ok=True)
    tiny_causal_lm(seed=seed).save_pretrained(path)
    build_tokenizer(TINY_SHAPE["vocab_size"]).save_pretrained(path)
    return path


# --- vllm/logprobs.py, vllm/outputs.py ---------------------------------------------------


@dataclass
class Logprob:
    """vllm.logprobs.Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """vllm.outputs.CompletionOutput (fields this fake fills; the rest keep defaults)."""

    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class RequestOutput:
    """vllm.outputs.RequestOutput."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: list[dict[int, Logprob] | None] | None,
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: Any = None,
        encoder_prompt: str | None = None,
        encoder_prompt_token_ids: list[int] | None = None,
        num_cached_tokens: int | None = None,
        num_cache_creation_tokens: int | None = None,
        *,
        prompt_token_id_logprobs: Any = None,
        kv_transfer_params: dict[str, Any] | None = None,
        ec_transfer_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished


# --- vllm/sampling_params.py, vllm/inputs/llm.py ------------------------------------------


@dataclass(kw_only=True)
class SamplingParams:
    """vllm.SamplingParams: the fields the backend sets, with 0.33.0's defaults.

    Keyword-only here (the real msgspec struct also takes them positionally): the backend
    must always name them.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # The checks of SamplingParams._verify_args that the backend could trip.
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")


class TokensPrompt(TypedDict):
    """vllm.inputs.TokensPrompt."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]


# --- vllm/distributed/weight_transfer/base.py, ipc_engine.py ------------------------------


@dataclass(frozen=True)
class ParamMeta:
    """vllm.distributed.weight_transfer.base.ParamMeta."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    owners: tuple[int, ...] | None = field(default=None, kw_only=True)
    mesh_shape: tuple[int, ...] | None = field(default=None, kw_only=True)
    placements: tuple[Any, ...] | None = field(default=None, kw_only=True)


class WeightSource(ABC):
    """vllm.distributed.weight_transfer.base.WeightSource."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        metadata = cls.__dict__.get("metadata")
        if metadata is not None and not isinstance(metadata, functools.cached_property):
            raise TypeError(f"{cls.__name__}.metadata must be a functools.cached_property")

    @property
    @abstractmethod
    def metadata(self) -> list[ParamMeta]:
        raise NotImplementedError

    def owned_names(self, rank: int) -> list[str]:
        return [m.name for m in self.metadata if m.owners is None or rank in m.owners]

    def implements_iter_full(self) -> bool:
        return type(self).iter_full is not WeightSource.iter_full

    def iter_full(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError


@dataclass
class IPCTrainerInitInfo:
    """vllm.distributed.weight_transfer.ipc_engine.IPCTrainerInitInfo."""

    backend: ClassVar[str] = "ipc"
    packed: bool = False
    packed_buffer_size_bytes: int = _PACKED_DEFAULT
    rank: int = field(kw_only=True)

    @property
    def is_sender(self) -> bool:
        return self.rank == 0


class IPCTrainerWeightTransferEngine:
    """vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine."""

    def __init__(
        self,
        *,
        client: Any,
        source: WeightSource,
        is_sender: bool = True,
        packed: bool = False,
        packed_buffer_size_bytes: int = _PACKED_DEFAULT,
    ) -> None:
        self.client = client
        self.source = source
        self.is_sender = is_sender
        self.packed = packed

    @classmethod
    def trainer_init(
        cls,
        init_info: IPCTrainerInitInfo,
        *,
        client: Any,
        source: WeightSource | None = None,
    ) -> IPCTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("IPC trainer weight transfer requires a WeightSource.")
        if not source.implements_iter_full():
            raise TypeError(f"IPC sends full tensors, but {type(source).__name__} does not")
        engine = cls(
            client=client, source=source, is_sender=init_info.is_sender, packed=init_info.packed
        )
        if engine.is_sender:
            engine.client.init_weight_transfer_engine({"packed": init_info.packed})
        return engine

    def send_weights(self) -> None:
        if self.is_sender:
            self.client.start_weight_update()
        names, dtype_names, shapes, handles = [], [], [], []
        for name, tensor in self.source.iter_full():
            names.append(name)
            dtype_names.append(str(tensor.dtype).split(".")[-1])
            shapes.append(list(tensor.shape))
            # Real: reduce_tensor(weight) -> {gpu_uuid: rebuild args}; here the tensor itself.
            handles.append({"fake-gpu": tensor.detach().contiguous()})
        if self.is_sender:
            self.client.update_weights(
                {
                    "names": names,
                    "dtype_names": dtype_names,
                    "shapes": shapes,
                    "ipc_handles": handles,
                }
            )
            self.client.finish_weight_update()


# --- vllm/entrypoints/llm.py (+ entrypoints/rl/offline.py) --------------------------------


class _FakeEngine:
    """What vLLM's worker holds: the model, the sleep state and the weight-update session."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.weights_resident = True
        self.kv_resident = True
        self.offloaded: dict[str, torch.Tensor] | None = None
        self.transfer_ready = False
        self.update_active = False
        self.weight_version = "0"


class LLM:
    """vllm.LLM on CPU.

    Extra constructor keywords the fake honours (all EngineArgs fields in the real one):
    ``enable_sleep_mode``, ``weight_transfer_config``, ``max_model_len``. Test-only
    attributes: ``drop_weight_updates``, ``calls`` (method names in call order).
    """

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        enforce_eager: bool = False,
        **kwargs: Any,
    ) -> None:
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        torch_dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).eval()
        self._engine = _FakeEngine(hf_model, AutoTokenizer.from_pretrained(tokenizer or model))
        self.engine_kwargs = dict(
            kwargs, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization
        )
        self._sleep_enabled = bool(kwargs.get("enable_sleep_mode", False))
        wt = kwargs.get("weight_transfer_config")
        self._transfer_backend = (
            None if wt is None else (wt["backend"] if isinstance(wt, dict) else wt.backend)
        )
        self._sleep_level = 0
        self.drop_weight_updates = False
        self.calls: list[str] = []

    # -- generation --

    def get_tokenizer(self) -> Any:
        return self._engine.tokenizer

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: Any = None,
        priority: int | Sequence[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        self.calls.append("generate")
        if not (self._engine.weights_resident and self._engine.kv_resident) or self._sleep_level:
            raise RuntimeError("engine is sleeping; call wake_up() before sending requests")
        prompt_list = prompts if isinstance(prompts, list) else [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            list(sampling_params)
            if isinstance(sampling_params, Sequence)
            else [sampling_params] * len(prompt_list)
        )
        if len(params) != len(prompt_list):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        counter = itertools.count()
        return [
            self._one(str(next(counter)), p, sp) for p, sp in zip(prompt_list, params, strict=True)
        ]

    def _one(self, request_id: str, prompt: Any, sp: SamplingParams) -> RequestOutput:
        tok = self._engine.tokenizer
        if isinstance(prompt, dict):
            ids = list(prompt["prompt_token_ids"])
            text = prompt.get("prompt")
        else:
            text = prompt
            ids = tok.encode(prompt, add_special_tokens=False)
        model = self._engine.model
        with torch.inference_mode():
            prompt_lps: list[dict[int, Logprob] | None] | None = None
            if sp.prompt_logprobs is not None:
                logits = model(input_ids=torch.tensor([ids])).logits[0].float()
                lps = torch.log_softmax(logits, -1)
                prompt_lps = [None] + [
                    {ids[i + 1]: Logprob(float(lps[i, ids[i + 1]]))} for i in range(len(ids) - 1)
                ]
            generator = torch.Generator().manual_seed(sp.seed if sp.seed is not None else 12345)
            outputs = [self._sample(ids, sp, i, generator) for i in range(sp.n)]
        return RequestOutput(request_id, text, ids, prompt_lps, outputs, True)

    def _sample(
        self, ids: list[int], sp: SamplingParams, index: int, generator: torch.Generator
    ) -> CompletionOutput:
        eos = self._engine.tokenizer.eos_token_id
        seq, out_ids, out_lps = list(ids), [], []
        finish = "length"
        for _ in range(sp.max_tokens or 16):
            logits = self._engine.model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            raw = torch.log_softmax(logits, -1)  # logprobs_mode="raw_logprobs"
            scores = logits / sp.temperature
            if sp.top_k > 0:
                kth = torch.topk(scores, sp.top_k).values[-1]
                scores = scores.masked_fill(scores < kth, -torch.inf)
            if sp.top_p < 1.0:
                order = torch.sort(scores, descending=True)
                cum = torch.softmax(order.values, -1).cumsum(-1)
                drop = cum - torch.softmax(order.values, -1) > sp.top_p
                scores[order.indices[drop]] = -torch.inf
            token = int(torch.multinomial(torch.softmax(scores, -1), 1, generator=generator))
            seq.append(token)
            out_ids.append(token)
            out_lps.append({token: Logprob(float(raw[token]), rank=1)})
            if token == eos:
                finish = "stop"
                break
        text = self._engine.tokenizer.decode(out_ids, skip_special_tokens=True)
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=out_ids,
            cumulative_logprob=sum(next(iter(d.values())).logprob for d in out_lps),
            logprobs=out_lps if sp.logprobs is not None else None,
            finish_reason=finish,
        )

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self.calls.append("reset_prefix_cache")
        return True

    # -- sleep mode --

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep({level})")
        if not self._sleep_enabled:
            raise ValueError("Sleep mode is not enabled (enable_sleep_mode=True)")
        engine = self._engine
        if level == 1:
            engine.offloaded = {k: v.clone() for k, v in engine.model.state_dict().items()}
        elif level == 2:
            engine.offloaded = None
        else:
            raise ValueError(f"unsupported sleep level {level}")
        with torch.no_grad():
            for p in engine.model.parameters():
                p.fill_(float("nan"))  # the GPU memory is gone
        engine.weights_resident = engine.kv_resident = False
        self._sleep_level = level

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(f"wake_up({tags})")
        engine = self._engine
        if tags is None or "weights" in tags:
            with torch.no_grad():
                if engine.offloaded is not None:
                    engine.model.load_state_dict(engine.offloaded)
                    engine.offloaded = None
                elif not engine.weights_resident:
                    # Level 2: the region is reallocated; its contents are garbage.
                    for p in engine.model.parameters():
                        p.copy_(torch.randn(p.shape) * 3.0)
            engine.weights_resident = True
        if tags is None or "kv_cache" in tags:
            engine.kv_resident = True
        fully_awake = engine.weights_resident and engine.kv_resident
        if fully_awake:
            self._sleep_level = 0
        return fully_awake

    # -- weight transfer (RLOfflineMixin -> worker) --

    def init_weight_transfer_engine(self, request: Any) -> None:
        self.calls.append("init_weight_transfer_engine")
        if self._transfer_backend is None:
            raise RuntimeError("weight_transfer_config is not set; cannot init weight transfer")
        init_info = request["init_info"] if isinstance(request, dict) else request.init_info
        if set(init_info) - {"packed"}:
            raise ValueError(f"Invalid init_info for IPCWeightTransferEngine: {init_info}")
        self._engine.transfer_ready = True

    def start_weight_update(self) -> None:
        self.calls.append("start_weight_update")
        if not self._engine.transfer_ready:
            raise RuntimeError("Weight transfer engine is not initialized")
        if self._engine.update_active:
            raise RuntimeError(
                "start_weight_update called while a weight update is already active."
            )
        self._engine.update_active = True

    def update_weights(self, request: Any) -> None:
        self.calls.append("update_weights")
        engine = self._engine
        if not engine.update_active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        if not engine.weights_resident:
            raise RuntimeError("weights are not resident (engine asleep)")
        info = request["update_info"] if isinstance(request, dict) else request.update_info
        names, handles = info["names"], info["ipc_handles"]
        if not len(names) == len(info["dtype_names"]) == len(info["shapes"]) == len(handles):
            raise ValueError("`names`, `dtype_names`, `shapes`, `ipc_handles` differ in size")
        params = dict(engine.model.named_parameters())
        with torch.no_grad():
            for name, handle, shape in zip(names, handles, info["shapes"], strict=True):
                if name not in params:
                    raise KeyError(f"unexpected weight {name!r}")
                tensor = handle["fake-gpu"]
                if list(tensor.shape) != list(shape) or list(params[name].shape) != list(shape):
                    raise ValueError(f"shape mismatch for {name}")
                if not self.drop_weight_updates:
                    params[name].copy_(tensor)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append("finish_weight_update")
        if not self._engine.update_active:
            raise RuntimeError(
                "finish_weight_update called without a matching start_weight_update."
            )
        self._engine.update_active = False
        if weight_version is not None:
            self._engine.weight_version = weight_version

    def update_weight_version(self, new_version: str) -> None:
        self._engine.weight_version = new_version

    def get_weight_version(self) -> str:
        return self._engine.weight_version

    # -- test helpers (not vLLM API) --

    @property
    def model(self) -> Any:
        """The engine's torch module (the fake's stand-in for the worker's model)."""
        return self._engine.model


def fake_api() -> VllmApi:
    """The :class:`VllmApi` made of this module's fakes."""
    return VllmApi(
        version=VERSION,
        LLM=LLM,
        SamplingParams=SamplingParams,
        TokensPrompt=TokensPrompt,
        WeightSource=WeightSource,
        ParamMeta=ParamMeta,
        IPCTrainerInitInfo=IPCTrainerInitInfo,
        IPCTrainerWeightTransferEngine=IPCTrainerWeightTransferEngine,
    )


MIRRORED: dict[str, tuple[Any, str]] = {
    # fake object -> dotted path of the real one in vllm 0.33.0
    "LLM.__init__": (LLM.__init__, "vllm.LLM.__init__"),
    "LLM.generate": (LLM.generate, "vllm.LLM.generate"),
    "LLM.get_tokenizer": (LLM.get_tokenizer, "vllm.LLM.get_tokenizer"),
    "LLM.sleep": (LLM.sleep, "vllm.LLM.sleep"),
    "LLM.wake_up": (LLM.wake_up, "vllm.LLM.wake_up"),
    "LLM.reset_prefix_cache": (LLM.reset_prefix_cache, "vllm.LLM.reset_prefix_cache"),
    "LLM.init_weight_transfer_engine": (
        LLM.init_weight_transfer_engine,
        "vllm.LLM.init_weight_transfer_engine",
    ),
    "LLM.start_weight_update": (LLM.start_weight_update, "vllm.LLM.start_weight_update"),
    "LLM.update_weights": (LLM.update_weights, "vllm.LLM.update_weights"),
    "LLM.finish_weight_update": (LLM.finish_weight_update, "vllm.LLM.finish_weight_update"),
    "LLM.update_weight_version": (LLM.update_weight_version, "vllm.LLM.update_weight_version"),
    "LLM.get_weight_version": (LLM.get_weight_version, "vllm.LLM.get_weight_version"),
    "SamplingParams": (SamplingParams, "vllm.SamplingParams"),
    "Logprob": (Logprob, "vllm.logprobs.Logprob"),
    "CompletionOutput": (CompletionOutput, "vllm.outputs.CompletionOutput"),
    "RequestOutput.__init__": (RequestOutput.__init__, "vllm.outputs.RequestOutput.__init__"),
    "ParamMeta": (ParamMeta, "vllm.distributed.weight_transfer.base.ParamMeta"),
    "WeightSource.owned_names": (
        WeightSource.owned_names,
        "vllm.distributed.weight_transfer.base.WeightSource.owned_names",
    ),
    "WeightSource.iter_full": (
        WeightSource.iter_full,
        "vllm.distributed.weight_transfer.base.WeightSource.iter_full",
    ),
    "IPCTrainerInitInfo": (
        IPCTrainerInitInfo,
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerInitInfo",
    ),
    "IPCTrainerWeightTransferEngine.__init__": (
        IPCTrainerWeightTransferEngine.__init__,
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.__init__",
    ),
    "IPCTrainerWeightTransferEngine.trainer_init": (
        IPCTrainerWeightTransferEngine.trainer_init,
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.trainer_init",
    ),
    "IPCTrainerWeightTransferEngine.send_weights": (
        IPCTrainerWeightTransferEngine.send_weights,
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.send_weights",
    ),
}
"""Every mirrored callable, for the signature test."""
