"""vLLM generation backend: a colocated engine whose weights are synced in memory each step.

Owns the adapter between the generation port (:class:`~sapo_async.policy.generation.base.Generator`)
and vLLM 0.33.0's offline ``LLM`` entry point: mapping sampling parameters, converting
``RequestOutput`` into :class:`GenerationResult`, pushing freshly trained weights into the
running engine, probing the engine after each sync, and sleeping/waking the engine around
the training step. vLLM exceptions are translated here (``GenerationError`` /
``WeightSyncError``), nowhere else.

Deliberately does not know the trainer, the node or the config file: it receives named
tensors and, for the probe, the trainer's torch module.

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

vLLM is imported lazily (:func:`load_vllm_api`), so this module imports and its pure parts
run without vLLM; tests drive the backend with a fake mirroring 0.33.0's signatures.

Invariants:
    * every sync is followed by a probe (engine vs trainer log-probs of
      :data:`~sapo_async.policy.generation.probe.PROBE_TEXT`); a mismatch above the threshold
      raises :class:`~sapo_async.errors.WeightSyncError` and the engine is not used again
      until a later sync passes;
    * the prefix cache is reset after every sync, so no KV computed by old weights is reused;
    * a level-2 sleep discards the weights, so waking from it requires the weights to be
      reloaded (``wake_up(named_tensors)``), and the probe runs after the wake;
    * one engine call at a time (an ``anyio.Lock``); blocking vLLM calls run in a worker
      thread under a timeout, and a timed-out engine is marked failed.

Not yet run on a GPU in this project (see docs/gpu.md).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from sapo_async.errors import ConfigError, GenerationError, WeightSyncError
from sapo_async.limits import (
    VLLM_GENERATE_TIMEOUT_S,
    VLLM_SLEEP_TIMEOUT_S,
    VLLM_WEIGHT_SYNC_TIMEOUT_S,
)
from sapo_async.logs import get_logger
from sapo_async.policy.generation.base import GenerationResult
from sapo_async.policy.generation.probe import (
    PROBE_TEXT,
    ProbeResult,
    causal_lm_token_logprobs,
    compare_logprobs,
)
from sapo_async.policy.generation.vllm_api import (
    VLLM_PINNED_VERSION,
    LLMSyncClient,
    VllmApi,
    VllmSettings,
    load_vllm_api,
    named_tensor_source,
    prompt_seed,
    to_vllm_sampling_params,
)
from sapo_async.wire import Completion, SamplingParams

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "VLLM_PINNED_VERSION",
    "VllmApi",
    "VllmGenerator",
    "VllmSettings",
    "VllmStatistics",
    "load_vllm_api",
    "to_vllm_sampling_params",
]

_T = TypeVar("_T")
_log = get_logger("generation.vllm")


@dataclass(frozen=True, slots=True)
class VllmStatistics:
    """What the backend has done, for metrics (read every round).

    Attributes:
        generate_calls: completed ``generate`` calls.
        generated_tokens: completion tokens returned.
        syncs: weight syncs that passed the probe.
        failed_probes: probes above the threshold.
        last_probe: the most recent probe, ``None`` before the first.
        last_sync_s: wall time of the most recent sync including its probe.
        sleeps: completed sleeps.
        asleep: whether the engine is asleep now.
        weight_version: the policy version last synced (``None`` before the first sync).
    """

    generate_calls: int
    generated_tokens: int
    syncs: int
    failed_probes: int
    last_probe: ProbeResult | None
    last_sync_s: float | None
    sleeps: int
    asleep: bool
    weight_version: int | None


class VllmGenerator:
    """A :class:`~sapo_async.policy.generation.base.Generator` backed by a colocated vLLM engine.

    Build one with :meth:`create` (starts the engine) or wrap an existing ``LLM``.

    Args:
        llm: a ``vllm.LLM`` started with ``weight_transfer_config={"backend": "ipc"}``
            (and ``enable_sleep_mode=True`` when ``settings.sleep_level > 0``).
        settings: the settings the engine was started with.
        api: the vLLM names to use (default: the real ones, imported now).
        trainer_model: the trainer's torch causal LM, used by the post-sync probe; may be
            attached later with :meth:`attach_trainer`.
        transfer_device: device the synced tensors must live on; CUDA IPC needs CUDA
            tensors, so the default is ``"cuda"``. Tests with the fake pass ``"cpu"``.
    """

    def __init__(
        self,
        llm: Any,
        settings: VllmSettings,
        *,
        api: VllmApi | None = None,
        trainer_model: Any | None = None,
        transfer_device: str = "cuda",
    ) -> None:
        self._llm = llm
        self._settings = settings
        self._api = api if api is not None else load_vllm_api()
        self._trainer_model = trainer_model
        self._transfer_device = transfer_device
        self._lock = anyio.Lock()
        self._source: Any | None = None
        self._transfer: Any | None = None
        self._probe_ids: list[int] | None = None
        self._asleep = False
        self._weights_awake = True  # False only between a level-2 sleep and its reload
        self._closed = False
        self._failed: str | None = None
        self._needs_sync = False
        self._generate_calls = 0
        self._generated_tokens = 0
        self._syncs = 0
        self._failed_probes = 0
        self._last_probe: ProbeResult | None = None
        self._last_sync_s: float | None = None
        self._sleeps = 0
        self._weight_version: int | None = None

    @classmethod
    async def create(
        cls,
        settings: VllmSettings,
        *,
        trainer_model: Any | None = None,
        api: VllmApi | None = None,
        transfer_device: str = "cuda",
    ) -> VllmGenerator:
        """Start a vLLM engine for ``settings`` and wrap it.

        Args:
            settings: engine settings.
            trainer_model: the trainer's torch module for the probe (or attach later).
            api: vLLM names (default: import the real vLLM).
            transfer_device: see the class docstring.

        Returns:
            A ready :class:`VllmGenerator`.

        Raises:
            GenerationError: vLLM is missing or the engine failed to start.
        """
        api = api if api is not None else load_vllm_api()
        started = time.perf_counter()
        try:
            llm = await anyio.to_thread.run_sync(
                functools.partial(api.LLM, settings.model, **settings.llm_kwargs())
            )
        except Exception as exc:
            raise GenerationError(f"vLLM engine failed to start for {settings.model!r}") from exc
        _log.info(
            "engine_started",
            model=settings.model,
            vllm=api.version,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            sleep_level=settings.sleep_level,
            seconds=round(time.perf_counter() - started, 2),
        )
        return cls(
            llm, settings, api=api, trainer_model=trainer_model, transfer_device=transfer_device
        )

    # --- the Generator protocol ---------------------------------------------------------

    @property
    def model_id(self) -> str:
        """Name of the model being sampled from."""
        return self._settings.model

    async def generate(
        self,
        prompts: Sequence[str],
        sampling: SamplingParams,
        *,
        n: int,
        seed: int | None = None,
    ) -> list[GenerationResult]:
        """Sample ``n`` completions for each prompt.

        Each prompt gets its own seed derived from ``seed`` (so prompts do not share a
        random stream). Log-probs are those of the sampled tokens at temperature 1.

        Raises:
            ConfigError: sampling parameters out of range.
            GenerationError: the engine is asleep, closed, failed, awaiting a sync that
                passes the probe, or vLLM raised or returned something malformed.
        """
        params = [
            to_vllm_sampling_params(self._api, sampling, n=n, seed=prompt_seed(seed, i))
            for i in range(len(prompts))
        ]
        if not prompts:
            return []
        async with self._lock:
            self._check_usable()
            if self._asleep:
                raise GenerationError("engine is asleep: call wake_up() before generate()")
            outputs = await self._call(
                "generate",
                VLLM_GENERATE_TIMEOUT_S,
                lambda: self._llm.generate(list(prompts), params, use_tqdm=False),
            )
        if len(outputs) != len(prompts):
            raise GenerationError(
                f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts"
            )
        results = [
            self._convert(prompt, output, n)
            for prompt, output in zip(prompts, outputs, strict=True)
        ]
        self._generate_calls += 1
        self._generated_tokens += sum(
            len(c.token_ids or ()) for r in results for c in r.completions
        )
        return results

    async def sync_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        policy_version: int | None = None,
    ) -> None:
        """Push the trainer's weights into the running engine, then probe.

        If the engine is asleep it is woken as its level requires (level 2: weights
        region first, load, then KV cache).

        Args:
            named_tensors: ``(hf_name, tensor)`` pairs, e.g. ``model.named_parameters()``.
            policy_version: optimizer steps taken; recorded as the engine's weight version.

        Raises:
            WeightSyncError: the probe found the engine disagreeing with the trainer.
            GenerationError: no trainer model attached, names/shapes changed since the first
                sync, or vLLM failed.
        """
        await self._sync(named_tensors, policy_version=policy_version)

    async def aclose(self) -> None:
        """Shut the engine down and drop it. Idempotent; never raises.

        In 0.33.0 the engine core runs in its own process; ``llm_engine.engine_core.
        shutdown()`` stops it (and frees its GPU memory) instead of waiting for garbage
        collection. A failure to shut down is logged, not raised: closing must finish.
        """
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            llm, self._llm = self._llm, None
            self._transfer = None
            self._source = None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            try:
                with anyio.fail_after(VLLM_SLEEP_TIMEOUT_S):
                    await anyio.to_thread.run_sync(shutdown, abandon_on_cancel=True)
            except Exception as exc:  # closing must finish; the error is recorded
                _log.warning("engine_shutdown_failed", error=repr(exc))
        _log.info("engine_closed", model=self._settings.model)

    # --- probe, sleep / wake ------------------------------------------------------------

    def attach_trainer(self, model: Any) -> None:
        """Set the trainer's torch causal LM used by the post-sync probe."""
        self._trainer_model = model

    @property
    def last_probe(self) -> ProbeResult | None:
        """The most recent probe, or ``None`` before the first sync."""
        return self._last_probe

    def statistics(self) -> VllmStatistics:
        """A snapshot of counters and the last probe (for the per-round metrics)."""
        return VllmStatistics(
            generate_calls=self._generate_calls,
            generated_tokens=self._generated_tokens,
            syncs=self._syncs,
            failed_probes=self._failed_probes,
            last_probe=self._last_probe,
            last_sync_s=self._last_sync_s,
            sleeps=self._sleeps,
            asleep=self._asleep,
            weight_version=self._weight_version,
        )

    async def probe(self) -> ProbeResult:
        """Compare the engine's log-probs of the probe text with the trainer's now.

        Returns:
            The passing :class:`ProbeResult` (also kept as :attr:`last_probe`).

        Raises:
            WeightSyncError: above the threshold.
            GenerationError: no trainer attached, engine asleep/closed, or vLLM failed.
        """
        async with self._lock:
            self._check_usable(allow_pending_sync=True)
            if self._asleep:
                raise GenerationError("engine is asleep: the probe runs after wake_up()")
            return await self._probe_locked()

    async def sleep(self) -> None:
        """Put the engine to sleep at ``settings.sleep_level`` (a no-op at level 0).

        Level 1 offloads weights to CPU and drops the KV cache; level 2 drops both (the
        next :meth:`wake_up` must be given the weights).

        Raises:
            GenerationError: the engine is closed/failed or vLLM failed.
        """
        level = self._settings.sleep_level
        if level == 0:
            return
        async with self._lock:
            self._check_usable(allow_pending_sync=True)
            if self._asleep:
                return
            await self._call("sleep", VLLM_SLEEP_TIMEOUT_S, lambda: self._llm.sleep(level=level))
            self._asleep = True
            self._weights_awake = level == 1  # level 1 keeps a CPU copy; level 2 does not
            self._sleeps += 1
        _log.info("engine_slept", level=level)

    async def wake_up(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
        *,
        policy_version: int | None = None,
    ) -> None:
        """Wake the engine, load ``named_tensors`` if given, and probe.

        Args:
            named_tensors: the trainer's current weights. Required after a level-2 sleep
                (its weights are gone); after a level-1 sleep they are synced if given,
                otherwise the restored weights are probed as they are.
            policy_version: as in :meth:`sync_weights`.

        Raises:
            WeightSyncError: the probe after the wake failed.
            GenerationError: level 2 without weights, or vLLM failed.
        """
        if named_tensors is not None:
            await self._sync(named_tensors, policy_version=policy_version)
            return
        async with self._lock:
            self._check_usable(allow_pending_sync=True)
            if not self._asleep:
                return
            if self._settings.sleep_level == 2:
                raise GenerationError(
                    "a level-2 sleep discarded the engine's weights: "
                    "wake_up(named_tensors) must reload them"
                )
            await self._call("wake_up", VLLM_SLEEP_TIMEOUT_S, self._llm.wake_up)
            self._asleep = False
            _log.info("engine_woke", level=1)
            await self._probe_locked()

    # --- internals ----------------------------------------------------------------------

    async def _sync(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, policy_version: int | None
    ) -> None:
        started = time.perf_counter()
        tensors = self._prepare(named_tensors)
        async with self._lock:
            self._check_usable(allow_pending_sync=True)
            if self._trainer_model is None:
                raise GenerationError(
                    "no trainer model attached: the post-sync probe cannot run "
                    "(pass trainer_model= or call attach_trainer(model))"
                )
            level = self._settings.sleep_level if self._asleep else 0
            self._needs_sync = True  # until a probe passes, nothing is generated
            if level == 1:
                await self._call("wake_up", VLLM_SLEEP_TIMEOUT_S, self._llm.wake_up)
                self._asleep = False
                _log.info("engine_woke", level=1)
            elif level == 2 and not self._weights_awake:
                # Weights region first (contents undefined), load, then the KV cache:
                # this order is what keeps a level-2 wake from serving gibberish. The flag
                # keeps a retry after a failed load from waking the weights region twice.
                await self._call(
                    "wake_up", VLLM_SLEEP_TIMEOUT_S, lambda: self._llm.wake_up(tags=["weights"])
                )
                self._weights_awake = True
            await self._call(
                "weight sync",
                VLLM_WEIGHT_SYNC_TIMEOUT_S,
                lambda: self._push(tensors, policy_version),
            )
            if level == 2:
                await self._call(
                    "wake_up", VLLM_SLEEP_TIMEOUT_S, lambda: self._llm.wake_up(tags=["kv_cache"])
                )
                self._asleep = False
                _log.info("engine_woke", level=2)
            result = await self._probe_locked()
            self._syncs += 1
            self._weight_version = policy_version
            self._last_sync_s = time.perf_counter() - started
        _log.info(
            "weights_synced",
            policy_version=policy_version,
            tensors=len(tensors),
            probe_mean_abs_diff=result.mean_abs_diff,
            probe_max_abs_diff=result.max_abs_diff,
            seconds=round(self._last_sync_s, 4),
        )

    def _prepare(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> list[tuple[str, torch.Tensor]]:
        # CUDA IPC shares CUDA memory only: tensors elsewhere are copied over first.
        target = self._transfer_device.split(":")[0]
        out: list[tuple[str, torch.Tensor]] = []
        for name, tensor in named_tensors:
            t = tensor.detach()
            if t.device.type != target:
                t = t.to(self._transfer_device)
            out.append((name, t))
        if not out:
            raise GenerationError("no tensors to sync")
        return out

    def _push(self, tensors: list[tuple[str, torch.Tensor]], policy_version: int | None) -> None:
        # Runs in a worker thread (blocking vLLM calls).
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

    async def _probe_locked(self) -> ProbeResult:
        if self._trainer_model is None:
            raise GenerationError(
                "no trainer model attached: the probe cannot run "
                "(pass trainer_model= or call attach_trainer(model))"
            )
        ids = await self._probe_token_ids()
        engine_lps = await self._call(
            "probe", VLLM_GENERATE_TIMEOUT_S, lambda: self._engine_prompt_logprobs(ids)
        )
        trainer_lps = await anyio.to_thread.run_sync(
            causal_lm_token_logprobs, self._trainer_model, ids
        )
        result = compare_logprobs(engine_lps, trainer_lps, threshold=self._settings.probe_threshold)
        self._last_probe = result
        if not result.ok:
            self._failed_probes += 1
            self._needs_sync = True
            _log.error(
                "weight_sync_probe_failed",
                probe_mean_abs_diff=result.mean_abs_diff,
                probe_max_abs_diff=result.max_abs_diff,
                threshold=result.threshold,
            )
            raise WeightSyncError(result.mean_abs_diff, result.threshold)
        self._needs_sync = False
        return result

    async def _probe_token_ids(self) -> list[int]:
        if self._probe_ids is None:
            tokenizer = await self._call("tokenizer", VLLM_SLEEP_TIMEOUT_S, self._llm.get_tokenizer)
            ids = [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]
            if len(ids) < 2:
                raise GenerationError(f"probe text encodes to {len(ids)} tokens; need >= 2")
            self._probe_ids = ids
        return self._probe_ids

    def _engine_prompt_logprobs(self, ids: list[int]) -> list[float]:
        # prompt_logprobs=0 returns, per prompt position, the log-prob of the actual token.
        params = self._api.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, seed=0)
        (output,) = self._llm.generate(
            [self._api.TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False
        )
        positions = output.prompt_logprobs
        if positions is None or len(positions) != len(ids):
            raise GenerationError("vLLM returned no prompt log-probs for the probe")
        values: list[float] = []
        for token, position in zip(ids[1:], positions[1:], strict=True):
            if position is None or token not in position:
                raise GenerationError(f"vLLM prompt log-probs lack token {token}")
            values.append(float(position[token].logprob))
        return values

    def _convert(self, prompt: str, output: Any, n: int) -> GenerationResult:
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
                float(position[token].logprob)
                for position, token in zip(c.logprobs, ids, strict=True)
            )
            converted.append(
                Completion(
                    text=c.text, finish_reason=c.finish_reason, token_ids=ids, logprobs=logprobs
                )
            )
        return GenerationResult(
            prompt=prompt,
            prompt_token_ids=tuple(int(t) for t in (output.prompt_token_ids or ())),
            completions=tuple(converted),
        )

    def _check_usable(self, *, allow_pending_sync: bool = False) -> None:
        if self._closed:
            raise GenerationError("vLLM backend is closed")
        if self._failed is not None:
            raise GenerationError(f"vLLM backend failed earlier: {self._failed}")
        if self._needs_sync and not allow_pending_sync:
            raise GenerationError(
                "the last weight sync did not pass the probe: sync again before generating"
            )

    async def _call(self, what: str, limit_s: float, fn: Callable[[], _T]) -> _T:
        """Run a blocking vLLM call in a thread under a timeout, translating its errors."""
        try:
            with anyio.fail_after(limit_s):
                return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
        except TimeoutError as exc:
            # The thread may still be inside vLLM: the engine's state is unknown.
            self._failed = f"{what} did not finish within {limit_s:.0f} s"
            raise GenerationError(f"vLLM {self._failed}") from exc
        except (GenerationError, ConfigError):
            raise
        except Exception as exc:
            raise GenerationError(f"vLLM {what} failed: {exc}") from exc
