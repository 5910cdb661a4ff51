"""What the async paper table runs and records: :class:`AsyncSpec` (with its arms) and
:class:`AsyncRun`.

Its own module so that the runner (:mod:`.paper_table_async`) and the report
(:mod:`.paper_table_report`) both import it and neither imports the other (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sapo_async.errors import ConfigError

if TYPE_CHECKING:
    from sapo_async.node.spec_defence import DefenceSpec

__all__ = [
    "ASYNC_PRESETS",
    "DEFENCES_OFF",
    "FILTERS",
    "MODEL_JOIN",
    "REAL_TASKS",
    "AsyncRun",
    "AsyncSpec",
    "arm_defence",
    "defended_arm",
    "parse_arm",
    "parse_models",
    "quick_async",
]

FILTERS = ("", "tis", "ftis", "fresh")

DEFENCES_OFF = "-off"
"""The arm suffix that runs every node with ``[defence] active = false`` (``"2/2-off"``):
the same arm with a node's defences off, recorded under its own label."""


def parse_arm(arm: str) -> tuple[int, int, str]:
    """``"4/4+ftis"`` -> ``(4, 4, "ftis")``; a trailing ``-off`` (defences off,
    :func:`arm_defence`) is allowed and not part of the result.

    Raises:
        ConfigError: not ``I/J`` with non-negative integers and a known filter.
    """
    head, _, filt = arm.removesuffix(DEFENCES_OFF).partition("+")
    try:
        i, j = (int(x) for x in head.split("/"))
    except ValueError:
        raise ConfigError(
            f"arm {arm!r} must be I/J with integers, optionally +tis, +ftis or +fresh, "
            f"then optionally {DEFENCES_OFF} (defences off)",
            field="arms",
        ) from None
    if i < 0 or j < 0 or i + j == 0 or filt not in FILTERS:
        raise ConfigError(
            f"arm {arm!r}: I, J >= 0, not both 0, suffix one of tis, ftis, fresh", field="arms"
        )
    return i, j, filt


MODEL_JOIN = "+"
"""What joins the two packaged models of a mixed swarm (``"smollm2-135m+gemma3-270m"``)."""


def parse_models(model: str) -> tuple[str, ...]:
    """The models an :class:`AsyncSpec`'s ``model`` names: one (``"tiny"`` or a packaged
    model, returned unchecked as before: the command line names the allowed ones), or two
    different packaged models joined by :data:`MODEL_JOIN`, node ``i`` running the
    ``i % 2``-th.

    Raises:
        ConfigError: a joined name with more than two models, one not packaged (``tiny``
            included), or the same model twice.
    """
    if MODEL_JOIN not in model:
        return (model,)
    from sapo_async.policy.models.packaged import packaged_model_names

    names = tuple(model.split(MODEL_JOIN))
    known = packaged_model_names()
    unknown = [n for n in names if n not in known]
    if len(names) != 2 or unknown or names[0] == names[1]:
        why = (
            f"{unknown[0]!r} is not a packaged model"
            if unknown
            else "it names the same model twice"
            if len(names) == 2
            else f"it joins {len(names)} models"
        )
        raise ConfigError(
            f"model {model!r} is not allowed ({why}): tiny, one packaged model, or two "
            f"different packaged models joined by {MODEL_JOIN!r} (packaged: "
            f"{', '.join(known)}; the tiny model does not mix with a real one)",
            field="model",
        )
    return names


def defended_arm(arm: str) -> str:
    """The arm with a node's defences that ``arm`` is the defences-off run of
    (``"2/2-off"`` -> ``"2/2"``); ``arm`` itself when its defences are on."""
    return arm.removesuffix(DEFENCES_OFF)


def arm_defence(arm: str) -> DefenceSpec:
    """Every node's ``[defence]`` in ``arm``: a volunteer's defaults (``DefenceSpec()``),
    or with ``-off`` the same with ``active`` off (as the attack experiment's "defences
    off")."""
    from sapo_async.node.spec_defence import DefenceSpec

    return DefenceSpec(active=not arm.endswith(DEFENCES_OFF))


@dataclass(frozen=True, slots=True)
class AsyncSpec:
    """One regime's experiment on the async path.

    Attributes:
        regime: the tiny model's warm start (``sparse``: the format must be discovered).
        tasks: task preset the model is warm-started on and the swarm draws from.
        rounds: rounds per node (the compute budget, equal for every arm).
        seeds: swarm seeds.
        arms: ``"I/J"`` with an optional ``+tis`` / ``+ftis`` / ``+fresh``, then an
            optional ``-off`` (every node's defences off: :func:`arm_defence`), run on every
            seed; the first is the baseline.
        side_arms: arms run on the first seed only (the filter comparison and where
            sharing stops paying: the CPU budget does not stretch to every seed).
        nodes: nodes per swarm.
        questions_per_round / completions_per_question: B and L.
        lr: AdamW learning rate.
        threshold: reward for the rounds-to-threshold column.
        max_new_tokens: completion cap.
        max_staleness_rounds: the sampler's staleness bound (the product's default, 4).
        tis_cap: truncation of the ``+tis`` arms' importance weights.
        ratio_cap: the ``+ftis`` filter's bound on a completion's importance ratio.
        threads: worker threads computing at once per swarm (one torch thread each).
        model: ``"tiny"`` (the project's character model of ``regime``), a packaged
            real model (``"smollm2-135m"``), or two packaged models joined by ``+``
            (``"smollm2-135m+gemma3-270m"``: node ``i`` runs the ``i % 2``-th,
            :func:`parse_models`); each loaded once per swarm and copied per node; a real
            model sees the instruct prompt (through its chat template where it has one).
        train_layers: train only the last N transformer blocks and the final norm
            (``PolicySpec.train_layers``); None trains every parameter.
        name: the output files' stem (default: ``regime``).
        eval_questions: after its last round, each node answers this many held-out
            questions of its families (:mod:`~sapo_async.experiment.held_out_eval`; the
            same for every arm of a seed); 0: none.
        eval_completions: answers sampled per held-out question.
    """

    regime: str = "sparse"
    tasks: str = "cpu_mix"
    rounds: int = 60
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = ("8/0", "4/4")
    side_arms: tuple[str, ...] = ("4/4+tis", "4/4+ftis", "1/7", "0/8")
    nodes: int = 8
    questions_per_round: int = 8
    completions_per_question: int = 8
    lr: float = 3e-5
    threshold: float = 0.05
    max_new_tokens: int = 16
    max_staleness_rounds: int = 4
    tis_cap: float = 2.0
    ratio_cap: float = 1.5
    threads: int = 1
    model: str = "tiny"
    train_layers: int | None = None
    name: str = ""
    eval_questions: int = 0
    eval_completions: int = 8

    def __post_init__(self) -> None:
        for arm in (*self.arms, *self.side_arms):
            local, _, _ = parse_arm(arm)
            if local > self.questions_per_round:  # a node's own check, before any swarm runs
                raise ConfigError(
                    f"arm {arm!r}: I ({local}) cannot exceed questions_per_round "
                    f"({self.questions_per_round})",
                    field="arms",
                )
        if len(parse_models(self.model)) > self.nodes:
            raise ConfigError(
                f"nodes {self.nodes} is not allowed with model {self.model!r}: at least "
                "one node per model",
                field="nodes",
            )
        if not self.arms or not self.seeds:
            raise ConfigError("the async paper table needs at least one arm and one seed")
        if self.eval_questions < 0:
            raise ConfigError(
                f"eval_questions {self.eval_questions} is not allowed: 0 (no held-out "
                "evaluation) or more",
                field="eval_questions",
            )
        if self.eval_completions < 1:
            raise ConfigError(
                f"eval_completions {self.eval_completions} is not allowed: at least 1",
                field="eval_completions",
            )

    @property
    def stem(self) -> str:
        """The output files' name: ``<stem>.json``, ``<stem>.md``, ``<stem>.png``."""
        return self.name or self.regime

    @property
    def real(self) -> bool:
        """Whether the swarm trains a real (packaged) model rather than the tiny one."""
        return self.model != "tiny"

    @property
    def models(self) -> tuple[str, ...]:
        """The models the swarm runs (two in a mixed swarm, :func:`parse_models`)."""
        return parse_models(self.model)

    @property
    def mixed(self) -> bool:
        """Whether the swarm's nodes run two models."""
        return len(self.models) > 1

    def node_model(self, node: int) -> str:
        """The model node ``node`` runs: the models in turn."""
        return self.models[node % len(self.models)]

    @property
    def all_arms(self) -> tuple[str, ...]:
        """Every arm, main ones first."""
        return (*self.arms, *(a for a in self.side_arms if a not in self.arms))

    def node_settings(self, seed: int) -> dict[str, Any]:
        """The node settings every swarm node and the lone node share (``NodeSpec.build``
        keywords): prompt style, tasks, sizes, trained layers and the seed."""
        return {
            "prompt_style": "auto" if self.real else "compact",
            "tasks": self.tasks,
            "train_layers": self.train_layers,
            "seed": seed,
            "questions_per_round": self.questions_per_round,
            "completions_per_question": self.completions_per_question,
            "max_new_tokens": self.max_new_tokens,
        }

    def jobs(self) -> list[tuple[str, int]]:
        """(arm, seed) pairs in running order: every seed of the main arms, seed by seed,
        then the side arms on the first seed."""
        main = [(arm, seed) for seed in self.seeds for arm in self.arms]
        side = [(arm, self.seeds[0]) for arm in self.side_arms if arm not in self.arms]
        return main + side


REAL_TASKS = "real_sparse"
"""The real model's families (:data:`sapo_async.tasks.spec.REAL_SPARSE_PRESET`): the low
end of the range where SmolLM2-135M-Instruct starts, about 0.02 to 0.5, where few local
groups carry signal (docs/results/paper-table-real/start.json). ``real_mix`` (the range's
upper end) is the table's earlier default, kept in docs/results/paper-table-real-mix-4."""

ASYNC_PRESETS: dict[str, AsyncSpec] = {
    "sparse": AsyncSpec(),
    # Sized from measured per-round cost on 2 cores (docs/swarm.md says how): 8 nodes
    # (about 9.4 GB resident) take about 2 hours for two seeds, so time, not memory, bounds
    # the node count; --resume keeps finished swarms across sittings. At 4 nodes (about 35 minutes
    # a seed) the goal was met on one seed of three (docs/results/paper-table-real-sparse).
    "smollm2": AsyncSpec(
        name="smollm2",
        model="smollm2-135m",
        tasks=REAL_TASKS,
        rounds=30,
        seeds=(0, 1),
        arms=("4/0", "2/2"),
        side_arms=(),
        nodes=8,
        questions_per_round=4,
        completions_per_question=4,
        lr=5e-5,
        threshold=0.1,
        max_new_tokens=32,
        train_layers=4,
        threads=2,
    ),
}
ASYNC_PRESETS["mixed"] = replace(
    ASYNC_PRESETS["smollm2"],
    name="smollm2-gemma3",
    model="smollm2-135m+gemma3-270m",
    arms=("4/0", "2/2", "2/2+ftis"),
)
"""Issue 58's table of two models: the SmolLM2 preset's sizes, nodes alternating SmolLM2 and
Gemma 3 270M, each model alone (4/0) and shared, with and without F-TIS's filter."""


def quick_async(spec: AsyncSpec) -> AsyncSpec:
    """A seconds-long version for tests: 3 nodes, 3 rounds, B = L = 4, two arms (a real
    model: 2 nodes, 2 rounds, B = L = 2, 8 tokens, the last block trains; two models: one
    node of each, 4 rounds, computing one at a time, and the arms with F-TIS's filter too).

    Two models: a Gemma 3 node takes about 5 s longer to build than a SmolLM2 one (9 s
    against 4 here), so in 2 rounds, even one node computing at a time, the SmolLM2 node
    often finished before the Gemma node's first groups were out and trained on none of
    them; in 3 it first trained on one in its last round. One worker thread and 4 rounds
    leave it about two rounds to see them."""
    if spec.real:
        return replace(
            spec,
            rounds=4 if spec.mixed else 2,
            seeds=spec.seeds[:1],
            arms=("2/0", "1/1", "1/1+ftis") if spec.mixed else ("2/0", "1/1"),
            side_arms=(),
            nodes=2,
            questions_per_round=2,
            completions_per_question=2,
            max_new_tokens=8,
            train_layers=1,
            threads=1 if spec.mixed else spec.threads,
        )
    return replace(
        spec,
        rounds=3,
        seeds=spec.seeds[:1],
        arms=("4/0", "2/2+ftis"),
        side_arms=(),
        nodes=3,
        questions_per_round=4,
        completions_per_question=4,
    )


@dataclass(frozen=True, slots=True)
class AsyncRun:
    """One (arm, seed) swarm.

    Attributes:
        config: the arm, e.g. ``"4/4"`` or ``"4/4+ftis"``.
        seed: the swarm seed.
        rewards: ``rewards[node][round]``, each node's training reward.
        family_rewards: ``family_rewards[family][node][round] = [sum, count]`` of that
            family's own completions.
        ended_s: ``ended_s[node][round]``, seconds from the swarm's start to the round's end.
        staleness: staleness of each external group trained on -> how many.
        external_used: external groups trained on, summed over nodes and rounds.
        received: external groups the collectors admitted, summed over nodes.
        external_failed: candidates dropped at scoring (filter included), by reason.
        log_ratios: the ratio filter's per-completion log ratios (``+ftis`` arms).
        commitments: round commitments confirmed on the ledger / journaled.
        phase_s: mean seconds per node-round of generate, publish, score (own and
            external) and train.
        seconds: wall time of the run (nodes joined to last node done).
        rejected: collector rejections summed over nodes, by reason.
        environment: what the run ran on (:func:`sapo_async.experiment.environment.environment`,
            with the model's weights); empty in runs recorded before it was kept.
        defence: every node's ``[defence]`` settings in the run (``DefenceSpec.model_dump``);
            empty in runs recorded before it was kept (a node's defaults of their day).
        eval_rewards: with ``eval_questions``, each node's mean reward on the held-out
            questions after its last round; empty without.
        eval_s: seconds the held-out evaluation took (not in ``seconds``).
        models: in a mixed swarm (:attr:`AsyncSpec.mixed`), the model each node ran;
            empty in a one-model swarm (its spec names the model) and in runs recorded
            before it was kept.
        retokenised: in a mixed swarm, each node's external completions trained on
            re-tokenised from their text, over its rounds: every one of the other model's
            (another tokenizer), and a peer's of its own model whose log-probs could not
            be kept (cut after its answer); empty otherwise.
        cross_model: in a mixed swarm, each node's external groups trained on whose
            producer ran the other model, over its rounds; empty otherwise.
    """

    config: str
    seed: int
    rewards: list[list[float]]
    family_rewards: dict[str, list[list[list[float]]]]
    ended_s: list[list[float]]
    staleness: dict[int, int]
    external_used: int
    received: int
    external_failed: dict[str, int]
    log_ratios: list[float]
    commitments: dict[str, int]
    phase_s: dict[str, float]
    seconds: float
    rejected: dict[str, int] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    defence: dict[str, Any] = field(default_factory=dict)
    eval_rewards: list[float] = field(default_factory=list)
    eval_s: float = 0.0
    models: list[str] = field(default_factory=list)
    retokenised: list[int] = field(default_factory=list)
    cross_model: list[int] = field(default_factory=list)
