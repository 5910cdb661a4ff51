"""What a node is asked to be: one typed, frozen :class:`NodeSpec` in five parts.

Owns the settings a node is built from, each documented once here, and their validation:
a spec that exists is valid, and a bad value raises :class:`~sapo_async.errors.ConfigError`
naming the field (``training.local``) and what is allowed. The parts:

* :class:`PolicySpec`: which model, tasks and generation backend;
* :class:`TrainingSpec`: the round (B, L, I, J), sampling and the GRPO settings;
* :class:`FabricSpec`: how rollouts are shared (NATS, or a given transport);
* :class:`LedgerSpec`: where round commitments go;
* :class:`CheckpointSpec`: where the node saves and resumes;
* :class:`DefenceSpec`: what a node refuses from peers (docs/security.md).

Names follow the volunteer's ``node.toml`` (:mod:`sapo_async.ops.config`), so one idea has
one name from the file to the round: B is ``questions_per_round``, L is
``completions_per_question``, I is ``local`` and J is ``external``.

:meth:`NodeSpec.build` is the flat keyword form :meth:`~sapo_async.node.swarm.Swarm.join`
accepts: a keyword is a field of the spec, a part's name (with a whole part), a field of
exactly one part (``local=2``), ``<part>_<field>`` (``checkpoint_every=5``), or a field of
the training part's :class:`~sapo_async.policy.grpo.config.TrainerConfig` (``lr=1e-5``,
``tis_cap=2.0``, or ``trainer_lr``).

Every part, and the spec itself, is a pydantic model
(:class:`~sapo_async.policy.settings.Settings`), and node.toml's sections are generated from
them (:mod:`sapo_async.ops.config_sections`): ``[node]`` from :data:`NODE_FILE_FIELDS`,
``[model]`` and ``[tasks]`` from :data:`POLICY_FILE_FIELDS`, ``[training]`` from
:data:`FILE_FIELDS` and the trainer's, ``[nats]``, ``[ledger]`` and ``[checkpoint]`` from
the fabric's, ledger's and checkpoint's file fields, ``[defence]`` is :class:`DefenceSpec`.
So a setting has one name, one default, one bound and one description from the file to the
code that uses it; what a file cannot give (a loaded model, a transport, a key object) is
the spec's only, and what it derives (paths under ``data_dir``, the hardware choice) is
derived once, in :meth:`~sapo_async.ops.config.NodeConfig.to_spec`.

Deliberately does not know how a node is assembled from it (:mod:`.swarm`), nor files or
environment variables (the volunteer's config builds a spec; see
:meth:`sapo_async.ops.config.NodeConfig.to_spec`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import Field, field_validator, model_validator

from sapo_async.errors import ConfigError
from sapo_async.limits import (
    ACTOR_DRAIN_TIMEOUT_S,
    BUFFER_MAX_AGE_S,
    DEFAULT_COMPLETIONS_PER_QUESTION,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_QUESTIONS_PER_ROUND,
    DEFAULT_SWARM_SEED,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    MAX_QUESTIONS_PER_ROUND,
    MAX_ROLLOUTS_PER_ROUND,
    MAX_SWARM_SEED,
)
from sapo_async.node.spec_defence import DefenceSpec
from sapo_async.node.spec_parts import CheckpointSpec, FabricSpec, LedgerSpec
from sapo_async.policy.grpo.config import TrainerConfig
from sapo_async.policy.settings import Settings, renamed_message

__all__ = [
    "FILE_FIELDS",
    "MAX_NODE_INDEX",
    "NODE_FILE_FIELDS",
    "POLICY_FILE_FIELDS",
    "SWARM_NAME_PATTERN",
    "CheckpointSpec",
    "DefenceSpec",
    "FabricSpec",
    "LedgerSpec",
    "NodeSpec",
    "PolicySpec",
    "TrainingSpec",
]

MAX_NODE_INDEX = 1 << 20
"""Node slots in the task index layout (:data:`sapo_async.tasks.source.MAX_NODES`)."""


class PolicySpec(Settings):
    """The model a node trains and how it generates.

    node.toml's ``[model]`` and ``[tasks]`` carry :data:`POLICY_FILE_FIELDS` of it under the
    same names; the rest is what the volunteer's request (``[model] name_or_path``,
    ``backend`` and ``device``, each possibly ``"auto"``, and ``[tasks] preset`` or
    ``families``) resolves to on the machine at hand
    (:func:`~sapo_async.ops.hardware.select_backend`), so it is not a file key.
    """

    part: ClassVar[str] = "policy"

    model: Any = Field(
        default="tiny",
        description="'tiny' (the project's offline model of regime), a local directory, a "
        "hub id, or an already loaded LoadedModel.",
    )
    regime: Literal["sparse", "dense"] = Field(
        default="sparse",
        description="Reward regime: 'sparse' (answer tag required) or 'dense' (partial "
        "credit); also picks the tiny model's warm start.",
    )
    tasks: Any = Field(
        default="cpu",
        description="A task preset name ('cpu', 'paper') or a sequence of reasoning-gym "
        "family names and FamilySpec.",
    )
    prompt_style: Literal["auto", "compact", "instruct"] = Field(
        default="auto",
        description="How questions are shown: 'compact' (bare expression, for models trained "
        "from scratch), 'instruct' (question plus answer-format instruction, for real LMs) "
        "or 'auto' (compact for the tiny model, instruct otherwise).",
    )
    device: Literal["cpu", "cuda"] = Field(
        default="cpu", description="Device to train and generate on."
    )
    generation_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Weights the CPU sampler runs: 'bfloat16' keeps a bf16 copy for "
        "generation (synced after every step; master weights stay float32), 2.3x plain "
        "generate and 1.6x float32 for SmolLM2 at 4 x 4 x 32 tokens on these cores "
        "(bench/results/real.json); 'auto' is "
        "bfloat16 for a model of 20 M parameters or more on a CPU with bf16 instructions "
        "(avx512_bf16 or amx), float32 for smaller models (the tiny one) and elsewhere.",
    )
    train_layers: int | None = Field(
        default=None,
        ge=1,
        description="Train only the last N transformer blocks and the final norm; the "
        "embeddings, the (tied) output head and the earlier blocks stay frozen. A CPU node's "
        "backward and AdamW step then cost a fraction of a full one (SmolLM2: see "
        "docs/learning.md); unset trains every parameter.",
    )
    backend: Literal["transformers", "vllm"] = Field(
        default="transformers",
        description="'transformers' (CPU or CUDA, shares the trainer's module) or 'vllm' (a "
        "colocated engine on the GPU, weights pushed in memory and checked by a log-prob "
        "probe after every step; needs the gpu extra).",
    )
    gpu_memory_utilization: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may take (the trainer needs the rest).",
    )
    sleep_mode: bool = Field(
        default=False,
        description="Let vLLM release GPU memory while the trainer steps (level 1 sleep).",
    )

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks(cls, value: Any) -> Any:
        """A preset name as it is; a sequence of family names or FamilySpec as FamilySpec."""
        from sapo_async.tasks.spec import FamilySpec

        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and value:
            families = []
            for item in value:
                if isinstance(item, str):
                    families.append(FamilySpec(item))
                elif isinstance(item, FamilySpec):
                    families.append(item)
                else:  # pydantic reports ValueError (not TypeError) with the field's name
                    raise ValueError(  # noqa: TRY004
                        f"a task family is a reasoning-gym name or a FamilySpec, got {item!r}"
                    )
            return tuple(families)
        raise ValueError(
            f"tasks is a preset name or a non-empty sequence of families, got {value!r}"
        )


POLICY_FILE_FIELDS = {
    "model": ("gpu_memory_utilization", "sleep_mode", "generation_dtype", "train_layers"),
    "tasks": ("regime", "prompt_style"),
}
"""The policy settings node.toml's ``[model]`` and ``[tasks]`` carry under the spec's names."""


class TrainingSpec(Settings):
    """One node's round: what it generates, what it trains on, and how.

    The same model gives node.toml's ``[training]`` section (:data:`FILE_FIELDS` of it and
    :data:`~sapo_async.policy.grpo.config.FILE_FIELDS` of its ``trainer``): each field's
    default, bounds and description are written once, here or in
    :class:`~sapo_async.policy.grpo.config.TrainerConfig`. ``max_new_tokens`` is the one
    completion length: generated, rewarded and trained on in full (it sets the trainer's
    ``max_completion_tokens``, :meth:`~sapo_async.node.learner.LearnerSettings.trainer_config`).
    """

    part: ClassVar[str] = "training"

    questions_per_round: int = Field(
        default=DEFAULT_QUESTIONS_PER_ROUND,
        ge=1,
        le=MAX_QUESTIONS_PER_ROUND,
        description=f"Questions sampled per round (B), 1..{MAX_QUESTIONS_PER_ROUND}.",
    )
    completions_per_question: int = Field(
        default=DEFAULT_COMPLETIONS_PER_QUESTION,
        ge=2,
        description="Completions per question (L); GRPO needs at least 2.",
    )
    local: int = Field(default=4, ge=0, description="Own question groups trained on per round (I).")
    external: int = Field(
        default=4,
        ge=0,
        description="Groups from other nodes trained on per round (J); 0 is plain GRPO.",
    )
    sampler: Literal["paper", "topk"] = Field(
        default="paper",
        description="External sampler: 'paper' drops zero-advantage groups then samples "
        "uniformly; 'topk' takes the most informative.",
    )
    per_producer_cap: int | None = Field(
        default=None, ge=1, description="Most external groups taken from one producer per round."
    )
    max_staleness_rounds: int = Field(
        default=4,
        ge=0,
        description="Drop external groups more than this many rounds behind the newest held "
        "from their producer.",
    )
    max_age_s: float = Field(
        default=BUFFER_MAX_AGE_S,
        gt=0,
        description="Drop external groups older than this many seconds.",
    )
    max_new_tokens: int = Field(
        default=DEFAULT_MAX_NEW_TOKENS,
        ge=1,
        description="Longest completion, in tokens: generated, rewarded and trained on in full.",
    )
    temperature: float = Field(
        default=DEFAULT_TEMPERATURE, gt=0, description="Sampling temperature."
    )
    top_p: float = Field(default=DEFAULT_TOP_P, gt=0, le=1, description="Nucleus sampling mass.")
    overlap: bool = Field(
        default=False,
        description="Generate round r+1 while round r trains, one policy version behind "
        "(costs a copy of the weights; see docs/swarm.md).",
    )
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig, description="GRPO and optimizer settings."
    )
    rounds: int | None = Field(
        default=None, ge=1, description="Stop after this many rounds (None: until the node leaves)."
    )
    seed: int = Field(
        default=DEFAULT_SWARM_SEED,
        ge=0,
        le=MAX_SWARM_SEED,
        description=f"The swarm seed, shared by all nodes (0..{MAX_SWARM_SEED}: it fills the "
        "top 12 bits of the 64-bit TaskRef.seed).",
    )
    external_filter: Any = Field(
        default=None,
        description="filter(learner, scored_group) -> reason | None, run on each external "
        "candidate the sampler scores; a reason drops it, counted under it in "
        "RoundReport.external_failed (e.g. node.filters). None: no filter.",
    )

    @model_validator(mode="after")
    def _round_fits(self) -> Self:
        b, i, j = self.questions_per_round, self.local, self.external
        if i + j == 0:
            raise ValueError("local + external must be at least 1 (nothing to train on)")
        if i > b:
            raise ValueError(f"local ({i}) cannot exceed questions_per_round ({b})")
        rollouts = b * self.completions_per_question
        if rollouts > MAX_ROLLOUTS_PER_ROUND:
            raise ValueError(
                f"questions_per_round x completions_per_question = {b} x "
                f"{self.completions_per_question} = {rollouts} rollouts a round, above the "
                f"{MAX_ROLLOUTS_PER_ROUND} one round's commitment may carry"
            )
        return self


FILE_FIELDS = tuple(
    name for name in TrainingSpec.model_fields if name not in {"trainer", "external_filter"}
)
"""The round settings a volunteer sets in ``node.toml``'s ``[training]`` (``trainer``'s own
come from its model)."""


_PARTS: dict[str, type[Settings]] = {
    "policy": PolicySpec,
    "training": TrainingSpec,
    "fabric": FabricSpec,
    "ledger": LedgerSpec,
    "checkpoint": CheckpointSpec,
    "defence": DefenceSpec,
}


SWARM_NAME_PATTERN = r"^[A-Za-z0-9_-]+$"
"""A swarm's name is part of every NATS subject and chain record: letters, digits, '-', '_'."""


class NodeSpec(Settings):
    """Everything a node is built from (see the module docstring); node.toml's ``[node]``
    carries :data:`NODE_FILE_FIELDS` of it (plus ``data_dir``, where the node's files go)."""

    part: ClassVar[str] = ""

    swarm: str = Field(
        default="local",
        min_length=1,
        pattern=SWARM_NAME_PATTERN,
        description="Swarm to join; part of every subject and of the chain records "
        "(letters, digits, '-' and '_').",
    )
    name: str | None = Field(
        default=None,
        description="Human-readable node name for logs, metrics and tables (unset: from the "
        "address).",
    )
    account: Any = Field(
        default=None, description="The node's key (a LocalAccount), its identity everywhere."
    )
    node_index: int | None = Field(
        default=None,
        ge=0,
        lt=MAX_NODE_INDEX,
        description="Slot in the task index layout (None: derived from the address).",
    )
    drain_timeout_s: float = Field(
        default=ACTOR_DRAIN_TIMEOUT_S,
        gt=0,
        description="On leave (SIGINT/SIGTERM for a volunteer), seconds allowed to finish the "
        "round and flush publishes and the journal before stopping hard.",
    )
    limiter: Any = Field(
        default=None, description="Worker-thread limiter shared by the nodes of a process."
    )
    policy: PolicySpec = Field(default_factory=PolicySpec, description="The model part.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="The round part.")
    fabric: FabricSpec = Field(default_factory=FabricSpec, description="The sharing part.")
    ledger: LedgerSpec = Field(default_factory=LedgerSpec, description="The chain part.")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="The checkpoint part."
    )
    defence: DefenceSpec = Field(default_factory=DefenceSpec, description="The defence part.")

    @model_validator(mode="after")
    def _parts_agree(self) -> Self:
        if self.policy.sleep_mode and self.training.overlap:
            raise ValueError(
                "policy.sleep_mode and training.overlap exclude each other (the engine "
                "sleeps while training)"
            )
        ledger = self.ledger
        if ledger.enabled and ledger.rpc_url is not None and ledger.journal_path is None:
            raise ValueError(
                "ledger.journal_path is needed with ledger.rpc_url (where commitments are "
                "journaled)"
            )
        return self

    @classmethod
    def build(cls, **settings: Any) -> Self:
        """A spec from flat keywords (see the module docstring); unnamed fields default.

        Raises:
            ConfigError: an unknown or ambiguous keyword, or an invalid value.
        """
        return cls().replace(**settings)

    def replace(self, **settings: Any) -> Self:
        """A copy with ``settings`` (flat keywords, as :meth:`build`) changed.

        Raises:
            ConfigError: an unknown or ambiguous keyword, or an invalid value.
        """
        top: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for key, value in settings.items():
            if key in _TOP_FIELDS:
                top[key] = value
                continue
            part, name = _route(key)
            parts.setdefault(part, {})[name] = value
        trainer = parts.pop(_TRAINER, None)
        if trainer is not None:
            training = parts.setdefault("training", {})
            if "trainer" in training or "training" in top:
                raise ConfigError(
                    f"trainer is given whole and field by field ({', '.join(trainer)})",
                    field="trainer",
                )
            base = top.get("training", self.training).trainer
            training["trainer"] = base.replace(**trainer)
        for part, changes in parts.items():
            if part in top:
                raise ConfigError(
                    f"{part} is given whole and field by field ({', '.join(changes)})",
                    field=part,
                )
            top[part] = getattr(self, part).replace(**changes)
        return type(self)(**{**self.as_fields(), **top})


NODE_FILE_FIELDS = ("swarm", "name", "drain_timeout_s")
"""The node's own settings a volunteer sets in ``node.toml``'s ``[node]``."""

_TOP_FIELDS = frozenset(NodeSpec.model_fields)
_TRAINER = "trainer"  # the pseudo-part of the training part's TrainerConfig fields


def _field_names(kind: type[Settings]) -> list[str]:
    return list(kind.model_fields)


def _part_fields() -> dict[str, list[tuple[str, str]]]:
    """Every flat keyword a part field answers to: its name and ``<part>_<name>``."""
    routes: dict[str, list[tuple[str, str]]] = {}
    kinds: dict[str, type] = {**_PARTS, _TRAINER: TrainerConfig}
    for part, kind in kinds.items():
        for name in _field_names(kind):
            routes.setdefault(name, []).append((part, name))
            routes.setdefault(f"{part}_{name}", []).append((part, name))
    # "trainer" is the training part's field (a whole TrainerConfig), not the pseudo-part
    routes["trainer"] = [("training", "trainer")]
    return routes


_ROUTES = _part_fields()


def _route(key: str) -> tuple[str, str]:
    """The part and field a flat keyword names."""
    found = _ROUTES.get(key, [])
    if len(found) == 1:
        return found[0]
    kinds: dict[str, type[Settings]] = {"": NodeSpec, **_PARTS, _TRAINER: TrainerConfig}
    for part, kind in kinds.items():
        old = key.removeprefix(f"{part}_") if part else key
        if old in kind.renamed:
            where = f"{part}." if part else ""
            raise ConfigError(renamed_message(where + old, kind.renamed[old]), field=key)
    if found:
        options = ", ".join(f"{part}_{name}" for part, name in found)
        raise ConfigError(f"{key} is ambiguous: say {options}", field=key)
    allowed = sorted(_TOP_FIELDS | {k for k, v in _ROUTES.items() if len(v) == 1})
    raise ConfigError(f"unknown node setting {key!r}; allowed: {', '.join(allowed)}", field=key)
