"""The sections of a volunteer node's ``node.toml``: one frozen pydantic model each.

A section that names settings of the node spec is generated from the spec's own model
(:func:`~sapo_async.ops.config_base.spec_section`): the key is the spec's field name, and
its type, default, bounds, checks and description are the spec's, so nothing is written
twice and nothing is renamed between the file and the node. ``[node]`` is
:class:`~sapo_async.node.spec.NodeSpec`'s, ``[model]`` and ``[tasks]`` are
:class:`~sapo_async.node.spec.PolicySpec`'s, ``[training]`` is
:class:`~sapo_async.node.spec.TrainingSpec`'s and its trainer's, ``[nats]``,
``[ledger]``, ``[checkpoint]`` are the fabric's, ledger's and checkpoint's parts, and
``[defence]`` is :class:`~sapo_async.node.spec_defence.DefenceSpec` itself. This module owns
only what a file has and a spec does not: where the node's files go (``[node] data_dir``),
the request hardware selection resolves (``[model] name_or_path``, ``backend``,
``device``; ``[tasks] preset``, ``families``), ``[identity]`` and ``[metrics]``, and the
old key names each section refuses, naming the new. :data:`SECTIONS` lists them in file
order.

Does not know files, the environment or how settings are used: :mod:`.config` loads them,
:mod:`.config_docs` renders them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from sapo_async.node.spec import (
    FILE_FIELDS as TRAINING_FILE_FIELDS,
)
from sapo_async.node.spec import (
    NODE_FILE_FIELDS,
    POLICY_FILE_FIELDS,
    NodeSpec,
    PolicySpec,
    TrainingSpec,
)
from sapo_async.node.spec_defence import DefenceSpec
from sapo_async.node.spec_parts import (
    CHECKPOINT_FILE_FIELDS,
    FABRIC_FILE_FIELDS,
    LEDGER_FILE_FIELDS,
    CheckpointSpec,
    FabricSpec,
    LedgerSpec,
)
from sapo_async.ops.config_base import Section, SpecSection, spec_section
from sapo_async.ops.config_checks import did_you_mean, existing_file, writable_dir
from sapo_async.policy.grpo.config import FILE_FIELDS as TRAINER_FILE_FIELDS
from sapo_async.policy.grpo.config import TrainerConfig
from sapo_async.policy.settings import StrList

__all__ = [
    "SECTIONS",
    "CheckpointSection",
    "DefenceSection",
    "IdentitySection",
    "LedgerSection",
    "MetricsSection",
    "ModelSection",
    "NatsSection",
    "NodeSection",
    "TasksSection",
    "TrainingSection",
]


class _NodeFile(SpecSection):
    """[node]: who this node is, where its files go, and how it leaves."""

    spec_kind = NodeSpec
    spec_fields = NODE_FILE_FIELDS
    renamed: ClassVar[dict[str, str]] = {
        "seed": "[training] seed",
        "rounds": "[training] rounds",
        "checkpoint_every": "[checkpoint] every",
    }

    data_dir: Path = Field(
        Path("~/.sapo"),
        description="Directory for this node's keystore, checkpoints, ledger journal and logs.",
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


class _ModelFile(SpecSection):
    """[model]: the policy model and how it generates.

    ``name_or_path``, ``backend`` and ``device`` are the volunteer's request, where "auto"
    lets hardware selection (:func:`~sapo_async.ops.hardware.select_backend`) choose the
    spec's ``model``, ``backend`` and ``device`` for the machine; the rest are the spec's.
    """

    spec_kind = PolicySpec
    spec_fields = POLICY_FILE_FIELDS["model"]

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


class _TasksFile(SpecSection):
    """[tasks]: the verifiable task families this node trains on.

    ``preset`` or ``families`` become the spec's ``tasks``.
    """

    spec_kind = PolicySpec
    spec_fields = POLICY_FILE_FIELDS["tasks"]

    preset: str = Field(
        "cpu", min_length=1, description="Named task preset (families and difficulty)."
    )
    families: StrList = Field(
        default_factory=list,
        description="reasoning-gym families to use; non-empty overrides the preset.",
    )

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


class _TrainingFile(SpecSection):
    """[training]: the SAPO/GRPO round and its trainer.

    The fields are :class:`~sapo_async.node.spec.TrainingSpec`'s
    (:data:`~sapo_async.node.spec.FILE_FIELDS`) and
    :class:`~sapo_async.policy.grpo.config.TrainerConfig`'s, under the same names, defaults
    and bounds (generated from them: nothing is written twice).
    """

    spec_kind = TrainingSpec
    spec_fields = TRAINING_FILE_FIELDS
    renamed: ClassVar[dict[str, str]] = {"overlap_generation": "overlap"}

    def to_part(self, **derived: Any) -> TrainingSpec:
        """The round these settings describe, its trainer built from the trainer's keys."""
        trainer = TrainerConfig(**{name: getattr(self, name) for name in TRAINER_FILE_FIELDS})
        return TrainingSpec(**self.spec_values(), trainer=trainer, **derived)


class _NatsFile(SpecSection):
    """[nats]: the NATS servers rollouts are shared over (the spec's fabric part)."""

    spec_kind = FabricSpec
    spec_fields = FABRIC_FILE_FIELDS
    renamed: ClassVar[dict[str, str]] = dict(FabricSpec.renamed)


class _LedgerFile(SpecSection):
    """[ledger]: where rollout commitments are recorded.

    The journal is ``<data_dir>/journal/journal.sqlite`` (derived, not a key).
    """

    spec_kind = LedgerSpec
    spec_fields = LEDGER_FILE_FIELDS


class _CheckpointFile(SpecSection):
    """[checkpoint]: how often the node saves (to <data_dir>/checkpoints)."""

    spec_kind = CheckpointSpec
    spec_fields = CHECKPOINT_FILE_FIELDS


if TYPE_CHECKING:  # mypy sees the bases (their spec fields typed Any); the models are generated
    NodeSection = _NodeFile
    ModelSection = _ModelFile
    TasksSection = _TasksFile
    TrainingSection = _TrainingFile
    NatsSection = _NatsFile
    LedgerSection = _LedgerFile
    CheckpointSection = _CheckpointFile
else:
    NodeSection = spec_section("NodeSection", _NodeFile)
    ModelSection = spec_section("ModelSection", _ModelFile)
    TasksSection = spec_section("TasksSection", _TasksFile)
    TrainingSection = spec_section(
        "TrainingSection", _TrainingFile, (TrainerConfig, TRAINER_FILE_FIELDS)
    )
    NatsSection = spec_section("NatsSection", _NatsFile)
    LedgerSection = spec_section("LedgerSection", _LedgerFile)
    CheckpointSection = spec_section("CheckpointSection", _CheckpointFile)

DefenceSection = DefenceSpec
"""[defence]: the spec's own model (:class:`~sapo_async.node.spec_defence.DefenceSpec`)."""


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
    "checkpoint": CheckpointSection,
    "defence": DefenceSection,
    "metrics": MetricsSection,
}
"""Every section, by its TOML name, in the order the example file lists them."""
