"""Models: loading any Hugging Face causal LM, and the tiny offline model with its cache."""

from sapo_async.models.loading import LoadedModel, cache_root, load_model
from sapo_async.models.tiny import (
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
from sapo_async.models.tokenizer import tokenizer_id, train_char_tokenizer

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
]
