"""Generation with a transformers causal LM on CPU or CUDA (the lean KV-cache loop).

Owns turning prompts into :class:`~sapo_async.policy.generation.base.GenerationResult` with the
model it is given. On CPU the generator holds the *trainer's own module* (no copy), so
every optimizer step is visible to the next generation and :meth:`sync_weights` has nothing
to do; a generator built with ``shares_trainer_module=False`` (a separate engine copy, e.g.
on another device) loads the tensors it is handed.

Sampling details (explicit temperature / top-k / top-p, temperature-1 log-probs) are in
:mod:`sapo_async.policy.generation.sampling`. Deliberately does not know about tasks or rewards.

Invariants:
    * results come back in prompt order with exactly ``n`` completions each;
    * ``token_ids`` include the stop token when the completion stopped; ``text`` is the
      decoded completion, and no other special token is ever sampled
      (:func:`banned_token_ids`), so ``text`` spells exactly the ids before the stop token;
    * ``generate`` is a coroutine because the port is async, but it runs the model in the
      calling thread: on the CPU swarm every node shares the same cores, so offloading to
      threads would only add contention (set ``offload_to_thread=True`` for a GPU engine
      whose kernels release the GIL).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import anyio.to_thread
import torch

from sapo_async.errors import ConfigError, GenerationError
from sapo_async.policy.digest import tokenizer_id as _tokenizer_id
from sapo_async.policy.generation.base import GenerationResult, check_sampling
from sapo_async.policy.generation.sampling import sample_batch
from sapo_async.wire import Completion, SamplingParams

__all__ = ["TransformersGenerator", "banned_token_ids", "stop_token_ids"]


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS plus the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(e) for e in eos)
    return sorted(ids)


def banned_token_ids(tokenizer: Any, stop_ids: Sequence[int]) -> list[int]:
    """The special tokens a completion may not hold: all of the tokenizer's but the stop
    tokens (decoding drops them, so the text would not spell the ids sampled)."""
    return sorted(set(map(int, tokenizer.all_special_ids)) - set(stop_ids))


class TransformersGenerator:
    """A :class:`~sapo_async.policy.generation.base.Generator` over a transformers causal LM.

    Args:
        model: the causal LM (on CPU, pass the trainer's module itself).
        tokenizer: its tokenizer (pad token optional; EOS required).
        model_id: name reported in rollout groups.
        max_batch_rows: split prompts x n into forward batches of at most this many rows.
        add_special_tokens: passed to the tokenizer for prompts (``False`` when prompts are
            already chat-templated).
        shares_trainer_module: ``True`` when ``model`` is the trainer's module (no sync).
        offload_to_thread: run sampling in a worker thread (see module docstring).

    Raises:
        ConfigError: the tokenizer has no EOS token or ``max_batch_rows < 1``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        max_batch_rows: int = 512,
        add_special_tokens: bool = True,
        shares_trainer_module: bool = True,
        offload_to_thread: bool = False,
    ) -> None:
        if tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer has no EOS token", field="model.tokenizer")
        if max_batch_rows < 1:
            raise ConfigError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self._model = model
        self._tokenizer = tokenizer
        self._model_id = model_id
        self._max_rows = max_batch_rows
        self._add_special = add_special_tokens
        self._shared = shares_trainer_module
        self._offload = offload_to_thread
        self._stop = stop_token_ids(model, tokenizer)
        self._banned = banned_token_ids(tokenizer, self._stop)
        pad = tokenizer.pad_token_id
        self._pad = int(pad) if pad is not None else self._stop[0]
        self._tokenizer_id = _tokenizer_id(tokenizer)
        self._closed = False

    @property
    def model_id(self) -> str:
        """Name of the model being sampled from."""
        return self._model_id

    @property
    def tokenizer_id(self) -> str:
        """Digest of the tokenizer (for ``RolloutGroup.tokenizer_id``)."""
        return self._tokenizer_id

    @property
    def model(self) -> Any:
        """The module sampled from."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer used for prompts and decoding."""
        return self._tokenizer

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt under this generator's tokenizer."""
        enc = self._tokenizer(list(prompts), add_special_tokens=self._add_special)
        return [list(ids) for ids in enc["input_ids"]]

    def generate_sync(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int, seed: int | None = None
    ) -> list[GenerationResult]:
        """Blocking twin of :meth:`generate` (see ``base.Generator.generate``)."""
        if self._closed:
            raise GenerationError("the generator is closed")
        check_sampling(sampling)
        if n < 1:
            raise ConfigError(f"n must be >= 1, got {n}", field="n")
        if not prompts:
            return []
        seed = secrets.randbits(63) if seed is None else seed
        prompt_ids = self.encode_prompts(prompts)
        device = next(self._model.parameters()).device
        per_chunk = max(1, self._max_rows // n)
        completions: list[Completion] = []
        try:
            for c, start in enumerate(range(0, len(prompt_ids), per_chunk)):
                batch = sample_batch(
                    self._model,
                    prompt_ids[start : start + per_chunk],
                    sampling,
                    n=n,
                    stop_ids=self._stop,
                    pad_id=self._pad,
                    seed=seed + c,
                    device=device,
                    banned_ids=self._banned,
                )
                texts = self._tokenizer.batch_decode(
                    [
                        ids[:-1] if reason == "stop" else ids
                        for ids, reason in zip(batch.token_ids, batch.finish_reasons, strict=True)
                    ],
                    skip_special_tokens=True,
                )
                for text, ids, lps, reason in zip(
                    texts, batch.token_ids, batch.logprobs, batch.finish_reasons, strict=True
                ):
                    completions.append(
                        Completion(
                            text=text,
                            finish_reason=reason,
                            token_ids=tuple(ids),
                            logprobs=tuple(lps),
                        )
                    )
        except (RuntimeError, ValueError, IndexError) as exc:
            raise GenerationError(f"sampling from {self._model_id} failed: {exc}") from exc
        return [
            GenerationResult(
                prompt=prompt,
                prompt_token_ids=tuple(ids),
                completions=tuple(completions[i * n : (i + 1) * n]),
            )
            for i, (prompt, ids) in enumerate(zip(prompts, prompt_ids, strict=True))
        ]

    async def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int, seed: int | None = None
    ) -> list[GenerationResult]:
        """See ``base.Generator.generate``; sampled in a worker thread when offloading."""
        if self._offload:
            return await anyio.to_thread.run_sync(
                lambda: self.generate_sync(prompts, sampling, n=n, seed=seed)
            )
        return self.generate_sync(prompts, sampling, n=n, seed=seed)

    async def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load trained weights; a no-op when the module is the trainer's own.

        Raises:
            GenerationError: a tensor name or shape does not fit the model.
        """
        if self._shared:
            return
        state = dict(named_tensors)
        try:
            with torch.no_grad():
                _, unexpected = self._model.load_state_dict(state, strict=False)
        except RuntimeError as exc:
            raise GenerationError(f"weight sync failed: {exc}") from exc
        if unexpected:
            raise GenerationError(f"weight sync got unknown tensors {sorted(unexpected)[:5]}")

    async def aclose(self) -> None:
        """Drop the reference to the model. Idempotent."""
        self._closed = True
