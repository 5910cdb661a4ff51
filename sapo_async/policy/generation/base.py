"""The generation port's protocol and result type.

Owns what every backend (transformers on CPU/CUDA, vLLM on GPU, the scripted fake used in
tests) promises. Backends are imported lazily by whoever picks one, so importing this
module never imports torch, transformers or vLLM.

Invariants:
    * ``generate`` returns one :class:`GenerationResult` per prompt, in prompt order, each
      with exactly ``n`` completions;
    * when a backend returns ``token_ids`` it also returns ``logprobs`` of the same length,
      the log-probabilities of the sampled tokens under the sampling distribution's
      underlying policy (temperature 1 log-softmax of the model's logits);
    * the same ``seed`` with the same weights gives the same completions on one backend;
    * sampling parameters out of range raise :class:`~sapo_async.errors.ConfigError`
      (:func:`check_sampling`), a closed backend raises
      :class:`~sapo_async.errors.GenerationError`.

tests/integration/test_generation_conformance.py checks these on every backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sapo_async.errors import ConfigError
from sapo_async.wire import Completion, SamplingParams

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["GenerationResult", "Generator", "check_sampling"]


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """The completions sampled for one prompt.

    Attributes:
        prompt: the prompt text as given.
        prompt_token_ids: the prompt's token ids under the backend's tokenizer.
        completions: the ``n`` completions.
    """

    prompt: str
    prompt_token_ids: tuple[int, ...]
    completions: tuple[Completion, ...]


@runtime_checkable
class Generator(Protocol):
    """A generation backend.

    Implementations: ``sapo_async.policy.generation.transformers_backend``,
    ``sapo_async.policy.generation.vllm_backend``, ``sapo_async.policy.generation.fake``.
    """

    @property
    def model_id(self) -> str:
        """Name of the model being sampled from."""
        ...

    async def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int, seed: int | None = None
    ) -> list[GenerationResult]:
        """Sample ``n`` completions for each prompt.

        Args:
            prompts: the prompt texts, in order.
            sampling: temperature, top-p/top-k and the new-token limit.
            n: completions per prompt (>= 1).
            seed: the sampling seed; ``None`` samples unseeded.

        Returns:
            One result per prompt, in order, each with ``n`` completions.

        Raises:
            ConfigError: a sampling parameter or ``n`` is out of range (model-backed
                backends check with :func:`check_sampling`).
            GenerationError: the backend failed (closed, asleep, or the engine raised).
        """
        ...

    async def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load freshly trained weights into the engine (a no-op for a backend that shares
        the trainer's module).

        Raises:
            WeightSyncError: the post-sync probe found the engine disagreeing.
        """
        ...

    async def aclose(self) -> None:
        """Release the engine's resources. Idempotent."""
        ...


def check_sampling(sampling: SamplingParams, *, prefix: str = "sampling") -> None:
    """Validate sampling parameters, as every model-backed generator does before sampling.

    Args:
        sampling: the parameters.
        prefix: the config section named in the error's field (``"sampling"`` or
            ``"training"``, where the caller's settings come from).

    Raises:
        ConfigError: a parameter is out of range (the field is named).
    """
    if not sampling.temperature > 0:
        raise ConfigError(
            f"temperature must be > 0, got {sampling.temperature}", field=f"{prefix}.temperature"
        )
    if not 0 < sampling.top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {sampling.top_p}", field=f"{prefix}.top_p")
    if sampling.top_k < 0:
        raise ConfigError(
            f"top_k must be >= 0 (0 = off), got {sampling.top_k}", field=f"{prefix}.top_k"
        )
    if sampling.max_new_tokens < 1:
        raise ConfigError(
            f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}",
            field=f"{prefix}.max_new_tokens",
        )
