"""Moving the trainer's weights into a running vLLM engine, and the engine's half of the probe.

Owns the blocking, engine-facing calls of a weight sync: preparing the trainer's named
tensors for transfer, pushing them through vLLM 0.33.0's weight-transfer API, and asking
the engine for its log-probs of the probe sequence. Deliberately does not know about
locking, timeouts, sleep levels or when a sync is due: :mod:`.vllm_backend` calls these in
a worker thread, under its lock and timeouts, in the order its sleep level requires.

The weight-sync path is vLLM 0.33.0's own weight-transfer API for a running engine, with
its CUDA-IPC backend (the one meant for a trainer colocated on the same GPU)::

    LLM(..., weight_transfer_config={"backend": "ipc"})          # engine side
    IPCTrainerWeightTransferEngine.trainer_init(                  # trainer side, once
        IPCTrainerInitInfo(rank=0), client=<LLM adapter>, source=<WeightSource>)
    engine.send_weights()    # per step: start_weight_update, update_weights (IPC handles
                             # of the trainer's CUDA tensors), finish_weight_update

The engine's worker rebuilds each tensor from its IPC handle and calls the model's own
``load_weights`` (which maps HF names such as ``q_proj``/``k_proj``/``v_proj`` onto
vLLM's fused ``qkv_proj``). No tensor is written to disk.

Invariants:
    * every sync after the first carries the first sync's names and shapes (else
      :class:`~sapo_async.errors.GenerationError`);
    * the prefix cache is reset after every push, so no KV computed by old weights is
      reused.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sapo_async.errors import GenerationError
from sapo_async.policy.generation.probe import PROBE_TEXT
from sapo_async.policy.generation.vllm_api import VllmApi

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "IpcWeightPush",
    "LLMSyncClient",
    "engine_prompt_logprobs",
    "named_tensor_source",
    "prepare_tensors",
    "probe_token_ids",
]

NamedTensors = list[tuple[str, "torch.Tensor"]]


def prepare_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], transfer_device: str
) -> NamedTensors:
    """Detach the trainer's tensors and place them where the transfer can share them.

    Args:
        named_tensors: ``(hf_name, tensor)`` pairs.
        transfer_device: e.g. ``"cuda"`` (CUDA IPC shares CUDA memory only: tensors
            elsewhere are copied over first).

    Returns:
        The detached tensors on ``transfer_device``'s type, in order.

    Raises:
        GenerationError: no tensors were given.
    """
    target = transfer_device.split(":", maxsplit=1)[0]
    out: NamedTensors = []
    for name, tensor in named_tensors:
        t = tensor.detach()
        if t.device.type != target:
            t = t.to(transfer_device)
        out.append((name, t))
    if not out:
        raise GenerationError("no tensors to sync")
    return out


class IpcWeightPush:
    """The trainer side of vLLM's IPC weight transfer into one engine (set up on first use).

    Args:
        api: the vLLM names.
        llm: the running ``vllm.LLM``.
    """

    def __init__(self, api: VllmApi, llm: Any) -> None:
        self._api = api
        self._llm = llm
        self._source: Any | None = None
        self._transfer: Any | None = None

    def push(self, tensors: NamedTensors, policy_version: int | None) -> None:
        """Send ``tensors`` into the engine and drop its prefix cache. Blocking.

        Raises:
            GenerationError: names or shapes differ from the first push's.
            Exception: whatever vLLM raises (the caller translates it).
        """
        if self._transfer is None:
            self._source = named_tensor_source(self._api, tensors)
            self._transfer = self._api.IPCTrainerWeightTransferEngine.trainer_init(
                self._api.IPCTrainerInitInfo(rank=0),
                client=LLMSyncClient(self._llm),
                source=self._source,
            )
        else:
            assert self._source is not None
            self._source.refill(tensors)
        self._transfer.send_weights()
        if policy_version is not None:
            self._llm.update_weight_version(str(policy_version))
        # KV computed by the old weights must not be reused for the same prompts.
        self._llm.reset_prefix_cache()

    def release(self) -> None:
        """Drop the transfer engine and its source (the engine is closing)."""
        self._transfer = None
        self._source = None


def probe_token_ids(tokenizer: Any) -> list[int]:
    """The probe text's token ids under the engine's tokenizer.

    Raises:
        GenerationError: the probe text encodes to fewer than two tokens.
    """
    ids = [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]
    if len(ids) < 2:
        raise GenerationError(f"probe text encodes to {len(ids)} tokens; need >= 2")
    return ids


def engine_prompt_logprobs(api: VllmApi, llm: Any, ids: list[int]) -> list[float]:
    """The engine's temperature-1 log-prob of each token of ``ids`` after the first. Blocking.

    Raises:
        GenerationError: vLLM returned no prompt log-probs, or lacks a token's.
    """
    # prompt_logprobs=0 returns, per prompt position, the log-prob of the actual token.
    params = api.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0)
    (output,) = llm.generate([api.TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    positions = output.prompt_logprobs
    if positions is None or len(positions) != len(ids):
        raise GenerationError("vLLM returned no prompt log-probs for the probe")
    values: list[float] = []
    for token, position in zip(ids[1:], positions[1:], strict=True):
        if position is None or token not in position:
            raise GenerationError(f"vLLM prompt log-probs lack token {token}")
        values.append(float(position[token].logprob))
    return values


class LLMSyncClient:
    """Adapts the offline ``LLM`` to vLLM's trainer-side ``VLLMWeightSyncClient`` protocol.

    The protocol passes bare dicts; ``LLM``'s own methods take request objects or dicts
    wrapped under ``init_info`` / ``update_info`` (``vllm/entrypoints/rl/offline.py``).
    """

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self._llm.start_weight_update()

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._llm.finish_weight_update(weight_version)


def named_tensor_source(api: VllmApi, tensors: NamedTensors) -> Any:
    """A vLLM ``WeightSource`` over the trainer's named tensors, refilled every sync."""

    class NamedTensorSource(api.WeightSource):  # type: ignore[misc,name-defined]
        def __init__(self, first: NamedTensors) -> None:
            self._tensors = first

        @functools.cached_property
        def metadata(self) -> list[Any]:
            return [api.ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self._tensors]

        def iter_full(self) -> Iterable[tuple[str, torch.Tensor]]:
            yield from self._tensors

        def refill(self, tensors: NamedTensors) -> None:
            expected = [(m.name, tuple(m.shape)) for m in self.metadata]
            got = [(name, tuple(t.shape)) for name, t in tensors]
            if got != expected:
                missing = sorted({n for n, _ in expected} - {n for n, _ in got})
                extra = sorted({n for n, _ in got} - {n for n, _ in expected})
                raise GenerationError(
                    "weights to sync differ from the first sync's names/shapes "
                    f"(missing {missing[:5]}, unexpected {extra[:5]})"
                )
            self._tensors = tensors

    return NamedTensorSource(tensors)
