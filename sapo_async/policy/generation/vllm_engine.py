"""A colocated vLLM engine's weights and sleep state: sync, probe, sleep, wake, close.

Owns the state machine of a running engine shared with the trainer on one GPU: pushing
freshly trained weights (through :mod:`.vllm_weights`), probing the engine after each sync,
sleeping and waking it around the training step, and closing it. Sampling from it is
:mod:`.vllm_backend`'s (:class:`~.vllm_backend.VllmGenerator` is this engine plus the
generation port). vLLM exceptions are translated here (``GenerationError`` /
``WeightSyncError``) and in :mod:`.vllm_backend`, nowhere else.

Deliberately does not know the trainer, the node or the config file: it receives named
tensors and, for the probe, the trainer's torch module.

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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
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
from sapo_async.policy.generation.probe import (
    ProbeResult,
    causal_lm_token_logprobs,
    compare_logprobs,
)
from sapo_async.policy.generation.vllm_api import VllmApi, VllmSettings, load_vllm_api
from sapo_async.policy.generation.vllm_weights import (
    IpcWeightPush,
    engine_prompt_logprobs,
    prepare_tensors,
    probe_token_ids,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["VllmEngine", "VllmStatistics"]

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


class VllmEngine:
    """A running ``vllm.LLM`` colocated with the trainer: its weights, sleep and lifecycle.

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
        self._weight_push = IpcWeightPush(self._api, llm)
        self._probe_ids: list[int] | None = None
        self._asleep = False
        self._weights_awake = True  # False only between a level-2 sleep and its reload
        self._closed = False
        self._failed: str | None = None
        self._needs_sync = False
        self._syncs = 0
        self._generate_calls = 0  # counted by the generator built on this engine
        self._generated_tokens = 0
        self._failed_probes = 0
        self._last_probe: ProbeResult | None = None
        self._last_sync_s: float | None = None
        self._sleeps = 0
        self._weight_version: int | None = None

    # --- weights, probe, sleep / wake ---------------------------------------------------

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
        started = time.perf_counter()
        tensors = prepare_tensors(named_tensors, self._transfer_device)
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
                lambda: self._weight_push.push(tensors, policy_version),
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
            await self.sync_weights(named_tensors, policy_version=policy_version)
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
            self._weight_push.release()
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            try:
                with anyio.fail_after(VLLM_SLEEP_TIMEOUT_S):
                    await anyio.to_thread.run_sync(shutdown, abandon_on_cancel=True)
            except Exception as exc:  # closing must finish; the error is recorded
                _log.warning("engine_shutdown_failed", error=repr(exc))
        _log.info("engine_closed", model=self._settings.model)

    # --- internals ----------------------------------------------------------------------

    async def _probe_locked(self) -> ProbeResult:
        if self._trainer_model is None:
            raise GenerationError(
                "no trainer model attached: the probe cannot run "
                "(pass trainer_model= or call attach_trainer(model))"
            )
        if self._probe_ids is None:
            tokenizer = await self._call("tokenizer", VLLM_SLEEP_TIMEOUT_S, self._llm.get_tokenizer)
            self._probe_ids = probe_token_ids(tokenizer)
        ids = self._probe_ids
        engine_lps = await self._call(
            "probe",
            VLLM_GENERATE_TIMEOUT_S,
            lambda: engine_prompt_logprobs(self._api, self._llm, ids),
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
