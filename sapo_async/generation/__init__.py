"""Generation port: a base protocol plus one module per backend (transformers, vllm, fake)."""

from sapo_async.generation.base import GenerationResult, Generator

__all__ = ["GenerationResult", "Generator"]
