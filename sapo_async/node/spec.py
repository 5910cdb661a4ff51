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

:class:`TrainingSpec` and :class:`DefenceSpec` are pydantic models
(:class:`~sapo_async.policy.settings.Settings`) and node.toml's ``[training]`` and
``[defence]`` sections are built from them, so a setting has one name, one default and
one bound from the file to the trainer; the other parts are frozen dataclasses checked in
``__post_init__``.

Deliberately does not know how a node is assembled from it (:mod:`.swarm`), nor files or
environment variables (the volunteer's config builds a spec; see
:meth:`sapo_async.ops.config.NodeConfig.to_spec`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

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
from sapo_async.node.spec_parts import CheckpointSpec, DefenceSpec, FabricSpec, LedgerSpec
from sapo_async.node.spec_parts import check as _check
from sapo_async.node.spec_parts import one_of as _one_of
from sapo_async.policy.grpo.config import TrainerConfig
from sapo_async.policy.settings import Settings

if TYPE_CHECKING:
    import anyio
    from eth_account.signers.local import LocalAccount

    from sapo_async.tasks.spec import FamilySpec

__all__ = [
    "FILE_FIELDS",
    "MAX_NODE_INDEX",
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


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """The model a node trains and how it generates.

    Attributes:
        model: ``"tiny"`` (the project's offline model of ``regime``), a local directory,
            a hub id, or an already loaded :class:`~sapo_async.policy.models.LoadedModel`.
        regime: the tiny model's warm start, ``"sparse"`` or ``"dense"``.
        tasks: a task preset name (``"cpu"``, ``"paper"``) or family specs.
        prompt_style: ``"compact"`` (bare expression, for models trained from scratch),
            ``"instruct"`` (question plus answer-format instruction, for real LMs) or
            ``"auto"`` (compact for the tiny model, instruct otherwise).
        device: ``"cpu"`` or ``"cuda"``.
        backend: ``"transformers"`` (CPU or CUDA, shares the trainer's module) or
            ``"vllm"`` (a colocated engine on the GPU, weights pushed in memory and checked
            by a log-prob probe after every step; needs the ``gpu`` extra).
        gpu_memory_utilization: the vLLM engine's share of GPU memory.
        sleep_mode: put the vLLM engine to sleep (level 1) around each training step.
    """

    model: Any = "tiny"
    regime: Literal["sparse", "dense"] = "sparse"
    tasks: str | tuple[FamilySpec, ...] = "cpu"
    prompt_style: Literal["auto", "compact", "instruct"] = "auto"
    device: str = "cpu"
    backend: Literal["transformers", "vllm"] = "transformers"
    gpu_memory_utilization: float = 0.3
    sleep_mode: bool = False

    def __post_init__(self) -> None:
        _one_of(self.regime, ("sparse", "dense"), "policy.regime")
        _one_of(self.prompt_style, ("auto", "compact", "instruct"), "policy.prompt_style")
        _one_of(self.backend, ("transformers", "vllm"), "policy.backend")
        _check(
            0 < self.gpu_memory_utilization <= 1,
            "policy.gpu_memory_utilization",
            "in (0, 1]",
            self.gpu_memory_utilization,
        )


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
        default=None, ge=0, description="Stop after this many rounds (None: until the node leaves)."
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
    name
    for name in TrainingSpec.model_fields
    if name not in {"trainer", "rounds", "seed", "external_filter"}
)
"""The round settings a volunteer sets in ``node.toml``'s ``[training]`` (``rounds`` and
``seed`` are ``[node]``'s; ``trainer``'s own come from its model)."""


_PARTS = {
    "policy": PolicySpec,
    "training": TrainingSpec,
    "fabric": FabricSpec,
    "ledger": LedgerSpec,
    "checkpoint": CheckpointSpec,
    "defence": DefenceSpec,
}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Everything a node is built from (see the module docstring).

    Attributes:
        swarm: the swarm's name (stream, subjects and ledger are per swarm).
        name: a human name for logs and tables (None: from the address).
        account: the node's key, its identity everywhere (None: a fresh one).
        node_index: slot in the task index layout (None: derived from the address).
        drain_timeout_s: how long leaving lets the round in progress finish.
        limiter: worker-thread limiter shared by the nodes of a process.
        policy / training / fabric / ledger / checkpoint / defence: the parts.
    """

    swarm: str = "local"
    name: str | None = None
    account: LocalAccount | None = None
    node_index: int | None = None
    drain_timeout_s: float = ACTOR_DRAIN_TIMEOUT_S
    limiter: anyio.CapacityLimiter | None = None
    policy: PolicySpec = field(default_factory=PolicySpec)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    fabric: FabricSpec = field(default_factory=FabricSpec)
    ledger: LedgerSpec = field(default_factory=LedgerSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    defence: DefenceSpec = field(default_factory=DefenceSpec)

    def __post_init__(self) -> None:
        _check(bool(self.swarm), "swarm", "a non-empty name", self.swarm)
        index = self.node_index
        _check(
            index is None or 0 <= index < MAX_NODE_INDEX,
            "node_index",
            f"None or in [0, {MAX_NODE_INDEX})",
            index,
        )
        _check(self.drain_timeout_s > 0, "drain_timeout_s", "> 0", self.drain_timeout_s)
        if self.policy.sleep_mode and self.training.overlap:
            raise ConfigError(
                "policy.sleep_mode and training.overlap exclude each other (the engine "
                "sleeps while training)",
                field="policy.sleep_mode",
            )
        for part, kind in _PARTS.items():
            value = getattr(self, part)
            _check(isinstance(value, kind), part, f"a {kind.__name__}", value)

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
            current = getattr(self, part)
            if isinstance(current, Settings):
                top[part] = current.replace(**changes)
            else:
                top[part] = dataclasses.replace(current, **changes)
        return dataclasses.replace(self, **top)


_TOP_FIELDS = frozenset(f.name for f in dataclasses.fields(NodeSpec))
_TRAINER = "trainer"  # the pseudo-part of the training part's TrainerConfig fields


def _field_names(kind: type) -> list[str]:
    if issubclass(kind, Settings):
        return list(kind.model_fields)
    return [f.name for f in dataclasses.fields(kind)]  # type: ignore[arg-type]


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
    if found:
        options = ", ".join(f"{part}_{name}" for part, name in found)
        raise ConfigError(f"{key} is ambiguous: say {options}", field=key)
    allowed = sorted(_TOP_FIELDS | {k for k, v in _ROUTES.items() if len(v) == 1})
    raise ConfigError(f"unknown node setting {key!r}; allowed: {', '.join(allowed)}", field=key)
