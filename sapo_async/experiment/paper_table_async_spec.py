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
    "REAL_TASKS",
    "AsyncRun",
    "AsyncSpec",
    "arm_defence",
    "defended_arm",
    "parse_arm",
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
        model: ``"tiny"`` (the project's character model of ``regime``) or a packaged
            real model (``"smollm2-135m"``), loaded once per swarm and copied per node;
            a real model sees the instruct prompt through its chat template.
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
            parse_arm(arm)
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


def quick_async(spec: AsyncSpec) -> AsyncSpec:
    """A seconds-long version for tests: 3 nodes, 3 rounds, B = L = 4, two arms (a real
    model: 2 nodes, 2 rounds, B = L = 2, 8 tokens, the last block trains)."""
    if spec.real:
        return replace(
            spec,
            rounds=2,
            seeds=spec.seeds[:1],
            arms=("2/0", "1/1"),
            side_arms=(),
            nodes=2,
            questions_per_round=2,
            completions_per_question=2,
            max_new_tokens=8,
            train_layers=1,
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
