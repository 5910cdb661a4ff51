"""Models: loading any Hugging Face causal LM, and the tiny offline model with its cache.

Names load on first use (:mod:`sapo_async._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports

if TYPE_CHECKING:
    from sapo_async.policy.digest import tokenizer_id
    from sapo_async.policy.models.loading import LoadedModel, load_model, train_last_layers
    from sapo_async.policy.models.packaged import cache_root
    from sapo_async.policy.models.tiny import (
        REGIMES,
        TinyModelSpec,
        WarmStartReport,
        WarmStartSpec,
        build_tiny_model,
        ensure_tiny_model,
        evaluate_reward,
        load_tiny_model,
        read_report,
        tiny_model_dir,
        tiny_spec,
    )
    from sapo_async.policy.models.tokenizer import train_char_tokenizer

_LAZY = {
    "LoadedModel": "sapo_async.policy.models.loading",
    "REGIMES": "sapo_async.policy.models.tiny",
    "TinyModelSpec": "sapo_async.policy.models.tiny",
    "WarmStartReport": "sapo_async.policy.models.tiny",
    "WarmStartSpec": "sapo_async.policy.models.tiny",
    "build_tiny_model": "sapo_async.policy.models.tiny",
    "cache_root": "sapo_async.policy.models.packaged",
    "ensure_tiny_model": "sapo_async.policy.models.tiny",
    "evaluate_reward": "sapo_async.policy.models.tiny",
    "load_model": "sapo_async.policy.models.loading",
    "load_tiny_model": "sapo_async.policy.models.tiny",
    "read_report": "sapo_async.policy.models.tiny",
    "tiny_model_dir": "sapo_async.policy.models.tiny",
    "tiny_spec": "sapo_async.policy.models.tiny",
    "tokenizer_id": "sapo_async.policy.digest",
    "train_char_tokenizer": "sapo_async.policy.models.tokenizer",
    "train_last_layers": "sapo_async.policy.models.loading",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "REGIMES",
    "LoadedModel",
    "TinyModelSpec",
    "WarmStartReport",
    "WarmStartSpec",
    "build_tiny_model",
    "cache_root",
    "ensure_tiny_model",
    "evaluate_reward",
    "load_model",
    "load_tiny_model",
    "read_report",
    "tiny_model_dir",
    "tiny_spec",
    "tokenizer_id",
    "train_char_tokenizer",
    "train_last_layers",
]
