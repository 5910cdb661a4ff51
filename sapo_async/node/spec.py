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
exactly one part (``local=2``), or ``<part>_<field>`` (``checkpoint_every=5``).

Deliberately does not know how a node is assembled from it (:mod:`.swarm`), nor files or
environment variables (the volunteer's config builds a spec; see
:meth:`sapo_async.ops.config.NodeConfig.to_spec`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

from sapo_async.errors import ConfigError
from sapo_async.limits import (
    ACTOR_DRAIN_TIMEOUT_S,
    BUFFER_MAX_AGE_S,
    MAX_SWARM_SEED,
)
from sapo_async.node.spec_parts import CheckpointSpec, DefenceSpec, FabricSpec, LedgerSpec
from sapo_async.node.spec_parts import check as _check
from sapo_async.node.spec_parts import one_of as _one_of

if TYPE_CHECKING:
    import anyio
    from eth_account.signers.local import LocalAccount

    from sapo_async.node.sampler import SamplerPolicy
    from sapo_async.policy.grpo.trainer import TrainerConfig
    from sapo_async.tasks.spec import FamilySpec

__all__ = [
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


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """One node's round: what it generates, what it trains on, and how.

    Attributes:
        questions_per_round: B, questions this node generates for per round.
        completions_per_question: L, completions sampled per question.
        local: I, own question groups trained on per round.
        external: J, other nodes' groups trained on per round (0: plain GRPO).
        sampler: ``"paper"`` (drop all-equal-reward groups, then draw uniformly) or
            ``"topk"`` (the most informative first).
        per_producer_cap: at most this many external groups from one producer per round
            (None: no cap).
        max_staleness_rounds: external groups more than this many rounds behind the newest
            held from their producer are not drawn (and are dropped).
        max_age_s: external groups older than this many seconds (by their time stamp) are
            rejected by the collector and dropped from its buffer.
        max_new_tokens / temperature / top_p: sampling. ``max_new_tokens`` is the one
            completion length: generated, rewarded and trained on in full (it sets the
            trainer's ``max_completion_tokens``).
        trainer: GRPO and optimizer settings (None: the defaults).
        tis_cap: cap of truncated importance weights from behaviour log-probs (None: the
            trainer's, off by default; 2.0 is the usual choice, docs/learning.md).
        tis_level: ``"token"`` (one weight per token) or ``"sequence"`` (one per sequence).
        overlap: generate round r+1 while round r trains, one policy version behind (the
            generator gets its own copy of the weights, synced after both halves).
        rounds: stop after this many rounds (None: until the node leaves).
        seed: the swarm seed, shared by all nodes (common random numbers).
        external_filter: ``filter(learner, scored_group) -> reason | None``, run on each
            external candidate the sampler scores; a reason drops the candidate, counted
            under it in ``RoundReport.external_failed`` (e.g. the importance-ratio filter
            of :mod:`sapo_async.node.filters`). None: no filter.
    """

    questions_per_round: int = 8
    completions_per_question: int = 8
    local: int = 4
    external: int = 4
    sampler: SamplerPolicy = "paper"
    per_producer_cap: int | None = None
    max_staleness_rounds: int = 4
    max_age_s: float = BUFFER_MAX_AGE_S
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    trainer: TrainerConfig | None = None
    tis_cap: float | None = None
    tis_level: Literal["token", "sequence"] = "token"
    overlap: bool = False
    rounds: int | None = None
    seed: int = 0
    external_filter: Any = None

    def __post_init__(self) -> None:
        b, i, j = self.questions_per_round, self.local, self.external
        _check(b >= 1, "training.questions_per_round", ">= 1", b)
        _check(
            self.completions_per_question >= 1,
            "training.completions_per_question",
            ">= 1",
            self.completions_per_question,
        )
        _check(
            i >= 0 and j >= 0 and i + j > 0,
            "training.local",
            ">= 0 with training.external >= 0 and not both 0",
            f"{i}/{j}",
        )
        _check(i <= b, "training.local", f"at most questions_per_round ({b})", i)
        _one_of(self.sampler, ("paper", "topk"), "training.sampler")
        cap = self.per_producer_cap
        _check(cap is None or cap >= 1, "training.per_producer_cap", "None or >= 1", cap)
        _check(
            self.max_staleness_rounds >= 0,
            "training.max_staleness_rounds",
            ">= 0",
            self.max_staleness_rounds,
        )
        _check(self.max_age_s > 0, "training.max_age_s", "> 0", self.max_age_s)
        _check(self.max_new_tokens >= 1, "training.max_new_tokens", ">= 1", self.max_new_tokens)
        _check(self.temperature > 0, "training.temperature", "> 0", self.temperature)
        _check(0 < self.top_p <= 1, "training.top_p", "in (0, 1]", self.top_p)
        _check(
            self.rounds is None or self.rounds >= 0, "training.rounds", "None or >= 0", self.rounds
        )
        _check(
            0 <= self.seed <= MAX_SWARM_SEED,
            "training.seed",
            f"in 0..{MAX_SWARM_SEED} (it fills the top 12 bits of the 64-bit TaskRef.seed)",
            self.seed,
        )
        tis = self.tis_cap
        _check(tis is None or tis > 0, "training.tis_cap", "None or > 0", tis)
        _one_of(self.tis_level, ("token", "sequence"), "training.tis_level")
        if self.trainer is not None and tis is not None:
            given = (self.trainer.tis_cap, self.trainer.tis_level)
            _check(
                given[0] is None or given == (tis, self.tis_level),
                "training.trainer.tis_cap",
                f"unset or equal to training.tis_cap ({tis}, {self.tis_level})",
                given,
            )

    def trainer_config(self) -> TrainerConfig:
        """The trainer's settings: ``trainer`` (or the defaults) with this round's
        completion length and, when set, its truncated IS."""
        from sapo_async.policy.grpo.trainer import TrainerConfig

        base = self.trainer or TrainerConfig()
        config = dataclasses.replace(base, max_completion_tokens=self.max_new_tokens)
        if self.tis_cap is None:
            return config
        return dataclasses.replace(config, tis_cap=self.tis_cap, tis_level=self.tis_level)


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
        for part, changes in parts.items():
            if part in top:
                raise ConfigError(
                    f"{part} is given whole and field by field ({', '.join(changes)})",
                    field=part,
                )
            top[part] = dataclasses.replace(getattr(self, part), **changes)
        return dataclasses.replace(self, **top)


_TOP_FIELDS = frozenset(f.name for f in dataclasses.fields(NodeSpec))


def _part_fields() -> dict[str, list[tuple[str, str]]]:
    """Every flat keyword a part field answers to: its name and ``<part>_<name>``."""
    routes: dict[str, list[tuple[str, str]]] = {}
    for part, kind in _PARTS.items():
        for f in dataclasses.fields(kind):
            routes.setdefault(f.name, []).append((part, f.name))
            routes.setdefault(f"{part}_{f.name}", []).append((part, f.name))
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
