"""Log-probs of completion tokens, without full-vocabulary logits for the whole batch.

Owns one computation: ``log p(token | prefix)`` for every completion token of a padded
:class:`~.batch.Batch`, and the policy's entropy there. The naive way (logits for every
position, ``log_softmax`` over the vocabulary, gather) holds ``B x W x V`` floats: at
Qwen2.5's 151,936-token vocabulary, 64 completions of 512 tokens after a 128-token prompt
that is about 25 GB before the backward pass. Here instead::

    h      = the decoder's last hidden states                 [B, W, H]
    h_c    = h at the positions that predict completion tokens  [N, H]   (N << B x W)
    for each chunk of ``chunk_tokens`` rows of h_c:               (recomputed in backward)
        z    = lm_head(h_chunk) in float32                       [chunk, V]
        logp = z[target] - logsumexp(z)

Each chunk runs under activation checkpointing, so autograd keeps only ``h_chunk`` and the
chunk's ``[chunk, V]`` logits exist once in the forward and once again in the backward:
at any moment a few ``chunk_tokens x V`` float32 tensors (logits, the entropy's softmax,
their gradient), whatever the batch. The entropy metric comes from the same logits. The values are
those of the naive path (a row's logsumexp does not depend on which rows share its
chunk); ``tests/unit/test_grpo_reference.py`` holds them to a record of it.

A model without a separable head (no ``get_output_embeddings`` or ``base_model``, or a
head that is not a plain linear map, e.g. logit soft-capping) falls back to its own
forward, whose full logits exist for the micro-batch; only the softmax is restricted to
completion positions and chunked. Micro-batches bound that case.

Deliberately does not know the loss, the optimizer or how rows were chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from sapo_async.errors import ConfigError
from sapo_async.policy.grpo.batch import Batch
from sapo_async.policy.grpo.config import DEFAULT_CHUNK_TOKENS
from sapo_async.policy.grpo.shared_prompt import shared_prompt_hidden

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "bf16_autocast",
    "bf16_supported",
    "completion_hidden",
    "cpu_bf16",
    "enable_activation_checkpointing",
    "token_logprobs",
]


def token_logprobs(
    model: Any,
    batch: Batch,
    *,
    entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, float]:
    """Log-probs of the batch's completion tokens, and optionally the entropy there.

    Args:
        model: a causal LM (transformers style: ``base_model`` and
            ``get_output_embeddings``, or any module whose output has ``logits``).
        batch: the padded batch.
        entropy: also compute the summed per-token entropy over completion tokens.
        chunk_tokens: completion positions per vocabulary chunk.
        share_prompts: run each distinct prompt once (:mod:`.shared_prompt`) where the
            model has a separable head and some prompt repeats.

    Returns:
        ``[B, W-1]`` float32 ``log p(ids[:, j + 1] | ids[:, :j + 1])`` where
        ``batch.comp_mask`` is 1 and 0 elsewhere (carrying gradient when the model does),
        and the *sum* of ``-sum_v p_v log p_v`` over completion positions (0.0 when not
        asked; never carries gradient).
    """
    where = batch.comp_mask.bool()
    hidden, project, targets = completion_hidden(model, batch, share_prompts=share_prompts)
    pieces: list[torch.Tensor] = []
    ent = 0.0
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start : start + chunk_tokens]
        t = targets[start : start + chunk_tokens]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, h_sum = checkpoint(_chunk, project, h, t, entropy, use_reentrant=False)
        else:
            lp, h_sum = _chunk(project, h, t, entropy)
        pieces.append(lp)
        ent += float(h_sum)
    flat = torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.zeros(where.shape, dtype=torch.float32, device=flat.device)
    return logp.masked_scatter(where, flat), ent


def completion_hidden(
    model: Any, batch: Batch, *, share_prompts: bool = False
) -> tuple[torch.Tensor, Any, torch.Tensor]:
    """What predicts the batch's completion tokens: ``(hidden, project, targets)``, where
    ``project(hidden[i])`` are the logits that predict ``targets[i]``, the completion tokens
    in row-major order (``batch.comp_mask``); ``hidden`` is the last hidden state where the
    model has a separable head, else the logits themselves (``project`` the identity)."""
    where = batch.comp_mask.bool()
    targets = batch.ids[:, 1:][where]
    head = _linear_head(model)
    sharing = share_prompts and head is not None
    shared = shared_prompt_hidden(model.base_model, batch) if sharing else None
    if shared is not None:
        return shared, head, targets
    if head is None:
        logits = model(input_ids=batch.ids, attention_mask=batch.attn).logits[:, :-1]
        return logits[where], _identity, targets
    out = model.base_model(input_ids=batch.ids, attention_mask=batch.attn)
    return out.last_hidden_state[:, :-1][where], head, targets


def _chunk(
    project: Any, h: torch.Tensor, targets: torch.Tensor, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` from one chunk's logits, and the chunk's summed entropy
    (0 when not asked; from the same logits, so the head runs once per chunk)."""
    z: torch.Tensor = project(h).float()
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
    with torch.no_grad():
        if not entropy:
            return logp, z.new_zeros(())
        all_logp = torch.log_softmax(z, dim=-1)
        return logp, -(all_logp.exp() * all_logp).sum()


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _linear_head(model: Any) -> Any:
    """The model's output projection when logits are exactly ``head(last_hidden_state)``."""
    from transformers import PreTrainedModel

    # Only a transformers model's ``base_model`` is known to return ``last_hidden_state``
    # (a PEFT wrapper's ``base_model`` is another causal LM).
    if not isinstance(model, PreTrainedModel):
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    base = getattr(model, "base_model", None)
    if get_head is None or base is None or base is model:
        return None
    head = get_head()
    config = getattr(model, "config", None)
    if not isinstance(head, torch.nn.Linear) or config is None:
        return None
    # Heads that rescale or cap logits after the projection (Gemma 2's soft-capping,
    # Cohere's logit_scale) need the model's own forward.
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, name, None) not in (None, 1, 1.0):
            return None
    return head


CPUINFO = Path("/proc/cpuinfo")
"""Where :func:`cpu_bf16` reads the CPU's flags."""


def cpu_bf16() -> bool:
    """Whether this CPU has bfloat16 instructions (``avx512_bf16`` or AMX's ``amx_bf16``):
    there bf16 matrix multiplies run several times faster than float32 (SmolLM2's shapes:
    bench/results/real.json, ``profile.sizes.*.limits``); elsewhere they are emulated and
    slower than float32."""
    try:
        flags = CPUINFO.read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_supported(device: torch.device) -> bool:
    """Whether bfloat16 autocast pays on ``device``: a CPU with bf16 instructions
    (:func:`cpu_bf16`), a CUDA device that says it supports bf16."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return device.type == "cpu" and cpu_bf16()


def bf16_autocast(device: torch.device, *, enabled: bool) -> Any:
    """bfloat16 autocast on ``device`` when ``enabled``, else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass (transformers models).

    Raises:
        ConfigError: the model has no such switch.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ConfigError(
            "trainer.gradient_checkpointing needs a transformers model",
            field="trainer.gradient_checkpointing",
        )
