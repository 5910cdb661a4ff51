"""vLLM generation backend: a colocated engine whose weights are synced in memory each step.

Owns the adapter between the generation port (:class:`~sapo_async.policy.generation.base.Generator`)
and vLLM 0.33.0's offline ``LLM`` entry point: starting the engine and sampling from it
(mapping sampling parameters and ``RequestOutput`` through :mod:`.vllm_api`), and the
per-round statistics. The engine's weights, probe, sleep and wake are
:class:`~.vllm_engine.VllmEngine`'s, which :class:`VllmGenerator` extends; how weights
travel is :mod:`.vllm_weights`'. Deliberately does not know the trainer, the node or the
config file.

vLLM is imported lazily (:func:`load_vllm_api`), so this module imports and its pure parts
run without vLLM; tests drive the backend with a fake mirroring 0.33.0's signatures.

Invariants:
    * ``generate`` refuses to run while the engine is asleep, closed, failed, or awaiting
      a sync that passes the probe;
    * each prompt samples from its own seed derived from the call's seed.

Not yet run on a GPU in this project (see docs/gpu.md).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from sapo_async.errors import GenerationError
from sapo_async.limits import VLLM_GENERATE_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.policy.generation.base import GenerationResult
from sapo_async.policy.generation.vllm_api import (
    VLLM_PINNED_VERSION,
    VllmApi,
    VllmSettings,
    from_request_output,
    load_vllm_api,
    prompt_seed,
    to_vllm_sampling_params,
)
from sapo_async.policy.generation.vllm_engine import VllmEngine, VllmStatistics
from sapo_async.wire import SamplingParams

__all__ = [
    "VLLM_PINNED_VERSION",
    "VllmApi",
    "VllmGenerator",
    "VllmSettings",
    "VllmStatistics",
    "load_vllm_api",
    "to_vllm_sampling_params",
]

_log = get_logger("generation.vllm")


class VllmGenerator(VllmEngine):
    """A :class:`~sapo_async.policy.generation.base.Generator` backed by a colocated vLLM engine.

    Build one with :meth:`create` (starts the engine) or wrap an existing ``LLM`` (arguments
    as :class:`~.vllm_engine.VllmEngine`'s, which owns weight sync, probe, sleep, wake,
    close and the statistics).
    """

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
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int, seed: int | None = None
    ) -> list[GenerationResult]:
        """See ``base.Generator.generate``. Each prompt gets its own seed derived from
        ``seed`` (prompts do not share a random stream); log-probs are those of the sampled
        tokens at temperature 1. ``GenerationError`` also when a sync awaits its probe, or
        vLLM returned something malformed."""
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
            from_request_output(prompt, output, n)
            for prompt, output in zip(prompts, outputs, strict=True)
        ]
        self._generate_calls += 1
        self._generated_tokens += sum(
            len(c.token_ids or ()) for r in results for c in r.completions
        )
        return results

    # --- probe, sleep / wake ------------------------------------------------------------
