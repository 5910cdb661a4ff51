"""Loading causal LMs: any Hugging Face model from a local directory or a hub id.

Owns the one place where transformers' ``from_pretrained`` is called and its errors are
translated. A hub id is only resolved when the process may use the network: with
``HF_HUB_OFFLINE=1`` (as in tests) only the local cache and local directories are used.
Deliberately does not know about the tiny model's build (see :mod:`sapo_async.policy.models.tiny`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from sapo_async.errors import ConfigError
from sapo_async.policy.digest import tokenizer_id
from sapo_async.policy.models.packaged import PACKAGED_MODELS, ensure_packaged_model

__all__ = ["LoadedModel", "load_model", "train_last_layers"]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model with its tokenizer.

    Attributes:
        model: the ``transformers`` causal LM module.
        tokenizer: its tokenizer (pad token set, padding side left).
        model_id: name for rollout groups (hub id or directory name).
        tokenizer_id: digest of the tokenizer (``RolloutGroup.tokenizer_id``).
        path: local directory the weights came from, when known.
    """

    model: Any
    tokenizer: Any
    model_id: str
    tokenizer_id: str
    path: Path | None = None


def load_model(
    name_or_path: str | Path,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    model_id: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: a local directory with ``config.json``, a packaged model's name
            (``"smollm2-135m"``, ``"gemma3-270m"``: :mod:`sapo_async.policy.models.packaged`,
            prepared offline on first use) or a hub id such as
            ``"Qwen/Qwen2.5-0.5B-Instruct"`` (hub only with network access, or when it is
            already in the local Hugging Face cache).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``None`` (float32 on CPU,
            bfloat16 on CUDA).
        model_id: name to report; defaults to the hub id or the directory name.

    Returns:
        The loaded model (in train mode, on ``device``) and tokenizer.

    Raises:
        ConfigError: the model or tokenizer cannot be loaded (missing directory, no network
            for a hub id, damaged safetensors weights, unknown dtype).
    """
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in dtypes:
        raise ConfigError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}", field="dtype")
    if str(name_or_path) in PACKAGED_MODELS:
        packaged = PACKAGED_MODELS[str(name_or_path)]
        name_or_path = ensure_packaged_model(packaged.name)
        model_id = model_id or packaged.model_id
    path = Path(name_or_path).expanduser()
    local = path.is_dir()
    if not local and Path(str(name_or_path)).is_absolute():
        raise ConfigError(f"model directory {path} does not exist", field="model")
    source = str(path) if local else str(name_or_path)
    # A swarm loads many copies of a small model: per-load progress bars are noise there.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtypes[dtype])
    except SafetensorError as exc:
        raise ConfigError(
            f"cannot load model {source!r}: its safetensors weights are damaged ({exc}); "
            "copy or download the model again (a packaged model's cache is checked and "
            "prepared again by itself)",
            field="model",
        ) from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load model {source!r} (a hub id needs network access or a local "
            f"cache; offline={os.environ.get('HF_HUB_OFFLINE', '0')}): {exc}",
            field="model",
        ) from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    model.train()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id or (path.name if local else str(name_or_path)),
        tokenizer_id=tokenizer_id(tokenizer),
        path=path if local else None,
    )


def train_last_layers(model: Any, layers: int) -> int:
    """Freeze every parameter of ``model`` but its last ``layers`` transformer blocks and
    the final norm (the embeddings and a tied output head stay frozen); returns how many
    parameters still train.

    The blocks are the model's largest ``ModuleList`` (``model.layers`` in Llama, Gemma
    and SmolLM2); the final norm is the ``norm`` module beside it, if any.

    Raises:
        ConfigError: the model has no block list, or fewer than ``layers`` blocks.
    """
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ConfigError(
            "model.train_layers: the model has no list of transformer blocks to choose from",
            field="model.train_layers",
        )
    blocks = max(lists, key=len)
    if layers > len(blocks):
        raise ConfigError(
            f"model.train_layers = {layers}: the model has {len(blocks)} blocks; allowed "
            f"1 to {len(blocks)}",
            field="model.train_layers",
        )
    model.requires_grad_(False)
    blocks[len(blocks) - layers :].requires_grad_(True)
    for module in model.modules():  # the final norm: a ``norm`` beside the block list
        norm = getattr(module, "norm", None)
        if isinstance(norm, torch.nn.Module) and any(c is blocks for c in module.children()):
            norm.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
