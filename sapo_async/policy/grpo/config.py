"""The GRPO trainer's settings: :class:`TrainerConfig`, each field defined once.

Every field's default, bounds and description live here and nowhere else: ``node.toml``'s
``[training]`` section takes the fields :data:`FILE_FIELDS` names from this model
(:mod:`sapo_async.ops.config_sections`), the node spec carries one instance
(``TrainingSpec.trainer``), and the trainer reads it. Names are the ones a GRPO user knows
from TRL and the DAPO paper: ``loss_type`` (TRL's values), ``clip_low`` / ``clip_high``
(DAPO's asymmetric epsilons), ``kl_beta``.

Free of torch, so loading a node's config does not import it (:mod:`.trainer` does).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from sapo_async.limits import DEFAULT_LOSS_TYPE, DEFAULT_LR
from sapo_async.policy.settings import Settings

__all__ = ["DEFAULT_CHUNK_TOKENS", "FILE_FIELDS", "TrainerConfig"]

DEFAULT_CHUNK_TOKENS = 512
"""Completion positions per vocabulary chunk: 512 x 151,936 x 4 bytes is 0.3 GB of
float32 logits at Qwen2.5's vocabulary, small beside the model, and chunks of that size
keep the head's matrix multiply efficient (:mod:`.logprobs`)."""


class TrainerConfig(Settings):
    """GRPO and optimizer settings (frozen; a bad value raises ``ConfigError`` naming
    ``trainer.<field>``)."""

    part: ClassVar[str] = "trainer"
    renamed: ClassVar[dict[str, str]] = {
        "aggregation": "loss_type",
        "eps_low": "clip_low",
        "eps_high": "clip_high",
        "beta": "kl_beta",
    }

    lr: float = Field(
        default=DEFAULT_LR,
        gt=0,
        lt=1,
        description="AdamW learning rate (3e-5 suits the tiny model; real models want ~1e-6).",
    )
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(
        default=1.0, description="Gradient clipping threshold (<= 0 disables)."
    )
    advantage: Literal["std", "mean"] = Field(
        default="std",
        description="Group advantage: reward minus mean, over the std ('std') or not.",
    )
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        default=DEFAULT_LOSS_TYPE,
        description="Loss aggregation: 'grpo' (per sequence), 'dapo' (token mean), "
        "'dr_grpo' (constant normaliser max_new_tokens).",
    )
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="PPO clip below (1 - clip_low).")
    clip_high: float = Field(default=0.28, ge=0, description="PPO clip above (1 + clip_high).")
    kl_beta: float = Field(
        default=0.0,
        ge=0,
        description="k3 KL penalty to a frozen copy of the initial model; 0 keeps no copy.",
    )
    tis_cap: float | None = Field(
        default=None,
        gt=0,
        description="Cap of truncated importance weights from the generator's log-probs "
        "(off when unset; 2.0 is the usual choice, see docs/learning.md).",
    )
    tis_level: Literal["token", "sequence"] = Field(
        default="token",
        description="Truncated IS per 'token' or one weight per 'sequence' (the product of "
        "its tokens' ratios).",
    )
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over the batch per step.")
    minibatches: int = Field(
        default=1, ge=1, description="Optimizer steps per epoch (the batch is split by sequences)."
    )
    max_completion_tokens: int = Field(
        default=64,
        ge=1,
        description="dr_grpo's normaliser and the most completion tokens trained on per "
        "sequence; a node sets it to its max_new_tokens (LearnerSettings.trainer_config).",
    )
    drop_uninformative: bool = Field(
        default=True, description="Drop all-equal-reward groups before the step."
    )
    skip_empty: bool = Field(
        default=True, description="Skip the optimizer step when no group is informative."
    )
    micro_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Padded tokens per forward/backward pass; gradients accumulate into one "
        "step (unset: the whole batch at once). 8192 suits a 24 GB GPU and a 0.5B model.",
    )
    logprob_chunk_tokens: int = Field(
        default=DEFAULT_CHUNK_TOKENS,
        ge=1,
        description="Completion positions whose vocabulary logits exist at once.",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute layer activations in the backward pass (less memory)."
    )
    bf16: bool | Literal["auto"] = Field(
        default="auto",
        description="Train under bfloat16 autocast (float32 master weights): true needs a CUDA "
        "device with bf16 or a CPU with bf16 instructions (avx512_bf16 or amx_bf16) and is "
        "refused elsewhere; 'auto' is on there for a model of 20 M parameters or more, off "
        "for smaller ones (the tiny model) and elsewhere.",
    )
    share_prompts: bool | Literal["auto"] = Field(
        default="auto",
        description="Run each distinct prompt of a batch once and its completions after its "
        "KV cache (a group's L rows share one prompt); equal to the padded forward up to "
        "float rounding (policy/grpo/shared_prompt.py). 'auto': on for a model of 20 M "
        "parameters or more, off for smaller ones (the tiny model).",
    )


FILE_FIELDS = (
    "lr",
    "loss_type",
    "clip_low",
    "clip_high",
    "kl_beta",
    "tis_cap",
    "tis_level",
    "micro_batch_tokens",
    "gradient_checkpointing",
    "bf16",
)
"""The trainer settings a volunteer sets in ``node.toml``'s ``[training]``, in file order."""
