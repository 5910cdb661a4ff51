"""The sections of a volunteer node's ``node.toml``: one frozen pydantic model each.

Owns every setting's type, default, bounds and description (each field is documented
exactly once, in its ``Field(description=...)``), and the checks across fields of one
section. :data:`SECTIONS` lists them in file order.

Does not know files, the environment or how settings are used: :mod:`.config` loads them,
:mod:`.config_docs` renders them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from sapo_async.errors import ConfigError
from sapo_async.limits import MAX_SWARM_SEED
from sapo_async.node.spec import FILE_FIELDS as TRAINING_FILE_FIELDS
from sapo_async.node.spec import NodeSpec, PolicySpec, TrainingSpec
from sapo_async.node.spec_parts import CheckpointSpec, DefenceSpec
from sapo_async.ops.config_base import Section, StrList, spec_default, split_list
from sapo_async.ops.config_checks import (
    did_you_mean,
    existing_file,
    writable_dir,
)
from sapo_async.ops.config_network import LedgerSection, NatsSection
from sapo_async.policy.grpo.config import FILE_FIELDS as TRAINER_FILE_FIELDS
from sapo_async.policy.grpo.config import TrainerConfig

__all__ = [
    "SECTIONS",
    "DefenceSection",
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
        spec_default(CheckpointSpec, "every"),
        ge=1,
        description="Write a checkpoint (model, optimizer, round, RNG) every N rounds; with "
        "the ledger on, every round, before its commitment (a restart then never commits a "
        "lower policy version than the chain has).",
    )
    drain_timeout_s: float = Field(
        spec_default(NodeSpec, "drain_timeout_s"),
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
        spec_default(PolicySpec, "gpu_memory_utilization"),
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
        spec_default(PolicySpec, "regime"),
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


class _TrainingFile(Section):
    """[training]: the SAPO/GRPO round and its trainer.

    The fields are :class:`~sapo_async.node.spec.TrainingSpec`'s and
    :class:`~sapo_async.policy.grpo.config.TrainerConfig`'s (:data:`TrainingSection`).
    """

    renamed: ClassVar[dict[str, str]] = {"overlap_generation": "overlap"}

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in cls.renamed.items():
                if old in data:
                    raise ValueError(f"{old} is now called {new}: rename the key")
        return data

    @model_validator(mode="after")
    def _spec_checks(self) -> Self:
        self.spec()  # the spec's own checks across fields (one place: TrainingSpec)
        return self

    def spec(self, *, rounds: int | None = None, seed: int = 0) -> TrainingSpec:
        """The round these settings describe (``rounds`` and ``seed`` are ``[node]``'s).

        Raises:
            ValueError: a combination the spec refuses (its one-line message).
        """
        values = {name: getattr(self, name) for name in type(self).model_fields}
        try:
            return TrainingSpec(
                **{name: values[name] for name in TRAINING_FILE_FIELDS},
                trainer=TrainerConfig(**{name: values[name] for name in TRAINER_FILE_FIELDS}),
                rounds=rounds,
                seed=seed,
            )
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("training: ")) from exc


def _file_fields(model: type[BaseModel], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: (model.model_fields[name].annotation, model.model_fields[name]) for name in names}


if TYPE_CHECKING:
    TrainingSection = _TrainingFile
else:
    TrainingSection = create_model(
        "TrainingSection",
        __base__=_TrainingFile,
        __module__=__name__,
        __doc__=_TrainingFile.__doc__,
        **_file_fields(TrainingSpec, TRAINING_FILE_FIELDS),
        **_file_fields(TrainerConfig, TRAINER_FILE_FIELDS),
    )
"""[training]: the round's fields of :class:`~sapo_async.node.spec.TrainingSpec` and the
trainer's of :class:`~sapo_async.policy.grpo.config.TrainerConfig`, under the same names,
defaults and bounds (generated from them: nothing is written twice)."""

DefenceSection = DefenceSpec
"""[defence]: the spec's own model (:class:`~sapo_async.node.spec_parts.DefenceSpec`)."""


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
