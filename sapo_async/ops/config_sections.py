"""The sections of a volunteer node's ``node.toml``: one frozen pydantic model each.

Owns every setting's type, default, bounds and description (each field is documented
exactly once, in its ``Field(description=...)``), and the checks across fields of one
section. :data:`SECTIONS` lists them in file order.

Does not know files, the environment or how settings are used: :mod:`.config` loads them,
:mod:`.config_docs` renders them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from sapo_async.limits import MAX_SWARM_SEED
from sapo_async.ops.config_base import Section, StrList, split_list
from sapo_async.ops.config_checks import (
    did_you_mean,
    existing_file,
    writable_dir,
)
from sapo_async.ops.config_network import LedgerSection, NatsSection

if TYPE_CHECKING:
    pass

__all__ = [
    "SECTIONS",
    "IdentitySection",
    "LedgerSection",
    "MetricsSection",
    "ModelSection",
    "NatsSection",
    "NodeSection",
    "StrList",
    "TasksSection",
    "TrainingSection",
]


class NodeSection(Section):
    """[node]: who this node is and how long it runs."""

    swarm: str = Field(
        "local",
        min_length=1,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="Swarm to join; part of every subject and of the chain records "
        "(letters, digits, '-' and '_').",
    )
    name: str = Field("", description="Human-readable node name for logs and metrics (optional).")
    data_dir: Path = Field(
        Path("~/.sapo"),
        description="Directory for this node's keystore, checkpoints, ledger journal and logs.",
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SWARM_SEED,
        description="Seed for task sampling and generation RNGs (0..4095: it fills the top "
        "12 bits of a 64-bit wire field).",
    )
    rounds: int | None = Field(
        None, ge=1, description="Rounds to run, then stop; unset runs until stopped."
    )
    checkpoint_every: int = Field(
        10,
        ge=1,
        description="Write a checkpoint (model, optimizer, round, RNG) every N rounds; with "
        "the ledger on, every round, before its commitment (a restart then never commits a "
        "lower policy version than the chain has).",
    )
    drain_timeout_s: float = Field(
        10.0,
        gt=0,
        description="On SIGINT/SIGTERM, seconds allowed to finish the round and flush "
        "publishes and the journal before stopping hard.",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return writable_dir(value)


class IdentitySection(Section):
    """[identity]: the node's Ethereum key, kept in an encrypted keystore."""

    keystore: Path | None = Field(
        None,
        description="Encrypted keystore file (created on first run); unset means "
        "<data_dir>/key.json.",
    )
    password_env: str = Field(
        "SAPO_KEY_PASSWORD",
        min_length=1,
        description="Environment variable holding the keystore password (checked first).",
    )
    password_file: Path | None = Field(
        None,
        description="File whose first line is the keystore password (checked second); "
        "if neither is set, the node prompts when run on a terminal.",
    )

    @field_validator("keystore")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @field_validator("password_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        return existing_file(value)


class ModelSection(Section):
    """[model]: the policy model and how it generates."""

    name_or_path: str = Field(
        "auto",
        min_length=1,
        description="Model directory or hub id; 'auto' picks by hardware, 'tiny' is the "
        "project's own CPU model.",
    )
    backend: Literal["auto", "transformers", "vllm"] = Field(
        "auto", description="Generation backend; 'auto' uses vLLM on a GPU when installed."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Device for training and generation; 'auto' uses CUDA if present."
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may take (the trainer needs the rest).",
    )
    sleep_mode: bool = Field(
        False, description="Let vLLM release GPU memory while the trainer steps."
    )


class TasksSection(Section):
    """[tasks]: the verifiable task families this node trains on."""

    preset: str = Field(
        "cpu", min_length=1, description="Named task preset (families and difficulty)."
    )
    families: StrList = Field(
        default_factory=list,
        description="reasoning-gym families to use; non-empty overrides the preset.",
    )
    regime: Literal["dense", "sparse"] = Field(
        "dense",
        description="Reward regime: 'dense' (partial credit) or 'sparse' (answer tag required).",
    )

    @field_validator("families", mode="before")
    @classmethod
    def _families_list(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: list[str]) -> list[str]:
        if not value:
            return value
        from reasoning_gym.factory import DATASETS  # 0.8 s: only when families are given

        for family in value:
            if family not in DATASETS:
                raise ValueError(
                    f"{family!r} is not a reasoning-gym family{did_you_mean(family, DATASETS)}; "
                    f"{len(DATASETS)} exist (python -c 'import reasoning_gym.factory as f; "
                    "print(sorted(f.DATASETS))')"
                )
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        from sapo_async.tasks.spec import PRESETS

        if value not in PRESETS:
            raise ValueError(
                f"{value!r} is not a task preset{did_you_mean(value, PRESETS)}; "
                f"allowed: {', '.join(map(repr, sorted(PRESETS)))}"
            )
        return value


class TrainingSection(Section):
    """[training]: the SAPO/GRPO round."""

    questions_per_round: int = Field(8, ge=1, description="Questions sampled per round (B).")
    completions_per_question: int = Field(
        8, ge=2, description="Completions per question (L); GRPO needs at least 2."
    )
    local: int = Field(4, ge=0, description="Own question groups trained on per round (I).")
    external: int = Field(
        4, ge=0, description="Groups from other nodes trained on per round (J); 0 is plain GRPO."
    )
    sampler: Literal["paper", "topk"] = Field(
        "paper",
        description="External sampler: 'paper' drops zero-advantage groups then samples "
        "uniformly; 'topk' takes the most informative.",
    )
    per_producer_cap: int | None = Field(
        None, ge=1, description="Most external groups taken from one producer per round."
    )
    lr: float = Field(3e-5, gt=0, lt=1, description="AdamW learning rate.")
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        "grpo",
        description="Loss aggregation: 'grpo' (per sequence), 'dapo' (token mean), "
        "'dr_grpo' (constant normaliser).",
    )
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO clip below (1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="PPO clip above (1 + clip_high).")
    kl_beta: float = Field(0.0, ge=0, description="KL penalty to the initial model; 0 disables.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(
        32,
        ge=1,
        description="Longest completion, in tokens: generated, rewarded and trained on in full.",
    )
    max_staleness_rounds: int = Field(
        8, ge=0, description="Drop external groups more than this many rounds behind."
    )
    max_age_s: float = Field(
        600.0, gt=0, description="Drop external groups older than this many seconds."
    )
    overlap_generation: bool = Field(
        False,
        description="Generate round r+1 while round r trains, one policy version behind "
        "(costs a copy of the weights; see docs/swarm.md).",
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="Cap of truncated importance weights from the generator's log-probs "
        "(off when unset; 2.0 is the usual choice, see docs/learning.md).",
    )
    tis_level: Literal["token", "sequence"] = Field(
        "token",
        description="Truncated IS per 'token' or one weight per 'sequence' (the product of "
        "its tokens' ratios).",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Padded tokens per forward/backward pass; gradients accumulate into one "
        "step (unset: the whole batch at once). 8192 suits a 24 GB GPU and a 0.5B model.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute layer activations in the backward pass (less memory)."
    )
    bf16: bool = Field(
        False, description="Train under bfloat16 autocast where the device supports it."
    )

    @model_validator(mode="after")
    def _some_groups(self) -> TrainingSection:
        if self.local + self.external == 0:
            raise ValueError("local + external must be at least 1 (nothing to train on)")
        if self.local > self.questions_per_round:
            raise ValueError(
                f"local ({self.local}) cannot exceed questions_per_round "
                f"({self.questions_per_round})"
            )
        return self


class DefenceSection(Section):
    """[defence]: what this node refuses from validly signed peers (docs/security.md)."""

    active: bool = Field(True, description="All content and resource defences on or off.")
    preset_only: bool = Field(
        True, description="Admit only task configs of this node's own preset and swarm seed."
    )
    max_prompt_chars: int = Field(8192, ge=1, description="Longest question admitted.")
    max_completion_chars: int = Field(8192, ge=1, description="Longest completion admitted.")
    max_groups_per_producer_round: int = Field(
        64, ge=1, description="Most groups admitted from one producer round."
    )
    plausibility: bool = Field(
        True, description="Drop groups this node's own model finds implausible."
    )
    plausibility_quantile: float = Field(
        0.01, gt=0, le=1, description="Quantile of own completions' mean log-prob..."
    )
    plausibility_margin: float = Field(1.0, ge=0, description="...minus this many nats.")
    length_guard: bool = Field(True, description="Drop needlessly long rewarded completions.")
    length_factor: float = Field(
        1.5, ge=1, description="Longest rewarded completion, times own rewarded length..."
    )
    length_quantile: float = Field(0.95, gt=0, le=1, description="...at this quantile.")
    calibration_min: int = Field(
        32, ge=1, description="Own completions a family needs before its thresholds apply."
    )
    quarantine_rate: float = Field(
        0.5, gt=0, le=1, description="Quarantine a producer when this share of its groups..."
    )
    quarantine_min_events: int = Field(8, ge=1, description="...of at least this many...")
    quarantine_s: float = Field(600.0, ge=0, description="...were dropped, for this long.")


class MetricsSection(Section):
    """[metrics]: what the volunteer sees."""

    prometheus_port: int | None = Field(
        None, ge=0, le=65535, description="Serve Prometheus metrics on this port; unset disables."
    )
    prometheus_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Interface the metrics endpoint binds; '0.0.0.0' exposes it to the network.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level."
    )
    log_json: bool | None = Field(
        None, description="JSON log lines (true) or console (false); unset picks by TTY."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


SECTIONS: dict[str, type[BaseModel]] = {
    "node": NodeSection,
    "identity": IdentitySection,
    "nats": NatsSection,
    "ledger": LedgerSection,
    "model": ModelSection,
    "tasks": TasksSection,
    "training": TrainingSection,
    "defence": DefenceSection,
    "metrics": MetricsSection,
}
"""Every section, by its TOML name, in the order the example file lists them."""
