"""Generation port: a base protocol plus one module per backend (transformers, vllm, fake).

Names load on first use (:mod:`sapo_async._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports

if TYPE_CHECKING:
    from sapo_async.policy.generation.base import GenerationResult, Generator

_LAZY = {
    "GenerationResult": "sapo_async.policy.generation.base",
    "Generator": "sapo_async.policy.generation.base",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "GenerationResult",
    "Generator",
]
