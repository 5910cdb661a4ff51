"""A scripted generator for tests: completions come from a function, not a model.

Owns nothing but the protocol's shape: results in prompt order with exactly ``n``
completions each, text only (no token ids or log-probs, like an external text-only
group). Records every call so tests can assert on prompts, seeds and weight syncs.
Always used beside tests of the real transformers backend, never instead of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from sapo_async.errors import GenerationError
from sapo_async.policy.generation.base import GenerationResult
from sapo_async.wire import Completion, SamplingParams

__all__ = ["FakeCall", "FakeGenerator"]

Script = Callable[[str, int, int | None], str]
"""``script(prompt, completion_index, seed) -> completion text``."""


@dataclass(frozen=True, slots=True)
class FakeCall:
    """One recorded ``generate`` call."""

    prompts: tuple[str, ...]
    sampling: SamplingParams
    n: int
    seed: int | None


@dataclass
class FakeGenerator:
    """A :class:`~sapo_async.policy.generation.base.Generator` whose completions are scripted.

    Attributes:
        script: maps (prompt, completion index, seed) to a completion text.
        model_id: name reported.
        calls: every generate call, in order.
        synced: number of ``sync_weights`` calls.
    """

    script: Script
    model_id: str = "fake"
    calls: list[FakeCall] = field(default_factory=list)
    synced: int = 0
    closed: bool = False

    async def generate(
        self, prompts: Sequence[str], sampling: SamplingParams, *, n: int, seed: int | None = None
    ) -> list[GenerationResult]:
        """Scripted completions (see ``base.Generator.generate``); none once closed."""
        if self.closed:
            raise GenerationError("the fake generator is closed")
        self.calls.append(FakeCall(tuple(prompts), sampling, n, seed))
        return [
            GenerationResult(
                prompt=p,
                prompt_token_ids=(),
                completions=tuple(
                    Completion(text=self.script(p, i, seed), finish_reason="stop") for i in range(n)
                ),
            )
            for p in prompts
        ]

    async def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Count the sync (the fake has no weights)."""
        for _ in named_tensors:
            pass
        self.synced += 1

    async def aclose(self) -> None:
        """Mark closed. Idempotent."""
        self.closed = True
