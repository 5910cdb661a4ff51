"""Deterministic task items: deriving them from a TaskRef, and choosing them per round.

Owns the seeding scheme (docs/learning.md, "Seeding") and the derivation
``TaskRef + config JSON -> TaskItem`` that every node, producer or receiver, runs with its
own copy of reasoning-gym. Deliberately does not know about prompts, models or rewards.

Seeding scheme. reasoning-gym seeds item ``i`` of a dataset with seed ``s`` as
``Random(s + i)``, so (s, i + 1) is the same item as (s + 1, i): nearby seeds overlap. We
therefore use ONE dataset seed per swarm and carve the index space into disjoint fields::

    dataset seed = swarm_seed << 52                 (swarms sit 2**52 items apart)
    index        = purpose << 50 | node << 30 | round << 10 | slot
                   purpose: 0 train, 1 eval,
                            2 warm start            (2 bits)
                   node:    node index < 2**20
                   round:   round < 2**20
                   slot:    question within the round < 2**10

Every (purpose, node, round, slot) maps to a distinct ``seed + index``, so different nodes,
and training versus evaluation, never draw the same item by accident, and the question set
of (swarm seed, node, round) is a pure function (common random numbers across configs).

Invariants:
    * :func:`derive` checks the config digest before anything else and returns the same
      item for the same (ref, config JSON) in any process;
    * foreign errors from reasoning-gym are translated to :class:`RejectedInput`
      (derivation from a peer's ref) or :class:`ConfigError` (a local source's settings).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import reasoning_gym

from sapo_async.errors import ConfigError, RejectedInput
from sapo_async.limits import MAX_QUESTIONS_PER_ROUND, MAX_SWARM_SEED
from sapo_async.tasks.spec import FamilySpec, config_digest
from sapo_async.wire import TaskRef

__all__ = [
    "MAX_NODES",
    "MAX_ROUNDS",
    "MAX_SLOTS",
    "Purpose",
    "TaskItem",
    "TaskSource",
    "dataset_seed",
    "derive",
    "item_index",
    "score_entry",
]

Purpose = Literal["train", "eval", "warmstart"]
_PURPOSE_CODE: Mapping[str, int] = {"train": 0, "eval": 1, "warmstart": 2}
MAX_SLOTS = MAX_QUESTIONS_PER_ROUND
MAX_ROUNDS = 1 << 20
MAX_NODES = 1 << 20


@dataclass(frozen=True, slots=True)
class TaskItem:
    """One question with its ground truth, re-derivable from ``ref`` and ``config_json``.

    Attributes:
        ref: where the item comes from.
        config_json: canonical JSON of the dataset config (keccak is ``ref.config_digest``).
        question: reasoning-gym's question text.
        answer: reasoning-gym's ground-truth answer.
        metadata: reasoning-gym's metadata dict (read-only by convention).
        entry: the whole reasoning-gym entry, which ``score_answer`` needs.
    """

    ref: TaskRef
    config_json: str
    question: str
    answer: str
    metadata: Mapping[str, Any]
    entry: Mapping[str, Any]


def dataset_seed(swarm_seed: int) -> int:
    """The reasoning-gym dataset seed of a swarm (``swarm_seed << 52``).

    Raises:
        ConfigError: a swarm seed outside ``0..MAX_SWARM_SEED`` (a larger one would not fit
            the 64-bit ``TaskRef.seed`` wire field).
    """
    if not 0 <= swarm_seed <= MAX_SWARM_SEED:
        raise ConfigError(
            f"swarm seed must be in 0..{MAX_SWARM_SEED} (it is shifted into a 64-bit wire "
            f"field), got {swarm_seed}",
            field="seed",
        )
    return swarm_seed << 52


def item_index(purpose: Purpose, node: int, round_: int, slot: int) -> int:
    """The dataset index of a question (see the module docstring for the layout).

    Raises:
        ConfigError: a field is out of its range.
    """
    if purpose not in _PURPOSE_CODE:
        raise ConfigError(
            f"purpose must be one of {sorted(_PURPOSE_CODE)}, got {purpose!r}", field="purpose"
        )
    for name, value, bound in (
        ("node", node, MAX_NODES),
        ("round", round_, MAX_ROUNDS),
        ("slot", slot, MAX_SLOTS),
    ):
        if not 0 <= value < bound:
            raise ConfigError(f"{name} must be in [0, {bound}), got {value}", field=name)
    return _PURPOSE_CODE[purpose] << 50 | node << 30 | round_ << 10 | slot


@lru_cache(maxsize=256)
def _dataset(family: str, config_json: str, seed: int) -> Any:
    config = json.loads(config_json)
    # size only bounds iteration, never item access; 1 keeps construction cheap.
    return reasoning_gym.create_dataset(family, seed=seed, size=1, **config)


def derive(ref: TaskRef, task_config_json: str) -> TaskItem:
    """Re-derive question, answer and metadata from a task reference.

    Args:
        ref: the reference (family, config digest, seed, index).
        task_config_json: the canonical config JSON the reference's digest covers.

    Returns:
        The item, identical in every process with the same reasoning-gym version.

    Raises:
        RejectedInput: the digest does not match the JSON (``task_config_digest``), the
            family is unknown (``task_family``), or reasoning-gym cannot build the item
            (``task_derivation``).
    """
    if config_digest(task_config_json) != ref.config_digest:
        raise RejectedInput(
            "task_config_digest",
            f"keccak of the config JSON is not {ref.config_digest} for {ref.family}",
        )
    if ref.family not in reasoning_gym.factory.DATASETS:
        raise RejectedInput("task_family", f"unknown reasoning-gym family {ref.family!r}")
    if ref.seed < 0 or ref.index < 0:
        raise RejectedInput("task_derivation", f"negative seed or index in {ref}")
    try:
        dataset = _dataset(ref.family, task_config_json, ref.seed)
        entry = dataset[ref.index]
    except Exception as exc:  # reasoning-gym raises anything from assert to KeyError
        raise RejectedInput(
            "task_derivation", f"{ref.family} cannot build item {ref.index}: {exc!r}"
        ) from exc
    return TaskItem(
        ref=ref,
        config_json=task_config_json,
        question=str(entry["question"]),
        answer=str(entry["answer"]),
        metadata=entry.get("metadata", {}),
        entry=entry,
    )


def score_entry(item: TaskItem, answer: str | None) -> float:
    """The family's own reasoning-gym score of ``answer`` (0 for ``None`` or ``""``).

    Raises:
        RejectedInput: ``score_error``, the family's scorer failed on this answer (a peer's
            text is anything; reasoning-gym raises anything from ValueError to
            IndexError), translated here so that no caller catches a bare exception.
    """
    if not answer:
        return 0.0
    dataset = _dataset(item.ref.family, item.config_json, item.ref.seed)
    try:
        return float(dataset.score_answer(answer, dict(item.entry)))
    except Exception as exc:  # reasoning-gym's scorers raise anything on odd text
        raise RejectedInput(
            "score_error", f"{item.ref.family} could not score {answer[:40]!r}: {exc!r}"
        ) from exc


class TaskSource:
    """The questions one node draws: a pure function of (families, swarm seed, node, round).

    Args:
        families: the families to mix (weights are relative).
        swarm_seed: the swarm's seed; all nodes of a swarm share it.

    Raises:
        ConfigError: no family, an unknown family, a non-positive weight, or a config
            reasoning-gym rejects.
    """

    def __init__(self, families: Sequence[FamilySpec], *, swarm_seed: int = 0) -> None:
        if not families:
            raise ConfigError("a task source needs at least one family", field="tasks.families")
        self._families = tuple(families)
        self._seed = dataset_seed(swarm_seed)
        self._swarm_seed = swarm_seed
        for spec in self._families:
            if spec.family not in reasoning_gym.factory.DATASETS:
                raise ConfigError(
                    f"unknown reasoning-gym family {spec.family!r}", field="tasks.families"
                )
            if spec.weight <= 0:
                raise ConfigError(
                    f"weight of {spec.family} must be > 0, got {spec.weight}",
                    field="tasks.families",
                )
            try:
                _dataset(spec.family, spec.config_json, self._seed)[0]
            except Exception as exc:
                raise ConfigError(
                    f"reasoning-gym rejected the config of {spec.family}: {exc!r}",
                    field="tasks.families",
                ) from exc
        self._weights = [spec.weight for spec in self._families]

    @property
    def families(self) -> tuple[FamilySpec, ...]:
        """The families this source mixes."""
        return self._families

    @property
    def swarm_seed(self) -> int:
        """The swarm seed this source was built with."""
        return self._swarm_seed

    def _family_for(self, purpose: Purpose, node: int, round_: int, slot: int) -> FamilySpec:
        if len(self._families) == 1:
            return self._families[0]
        key = f"{self._swarm_seed}:{purpose}:{node}:{round_}:{slot}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        return rng.choices(self._families, weights=self._weights, k=1)[0]

    def item(self, purpose: Purpose, node: int, round_: int, slot: int) -> TaskItem:
        """The item at one position of the index layout.

        Raises:
            ConfigError: a position field is out of range.
        """
        spec = self._family_for(purpose, node, round_, slot)
        ref = TaskRef(
            family=spec.family,
            config_digest=spec.digest,
            seed=self._seed,
            index=item_index(purpose, node, round_, slot),
        )
        return derive(ref, spec.config_json)

    def round_items(
        self, node: int, round_: int, questions_per_round: int, *, purpose: Purpose = "train"
    ) -> list[TaskItem]:
        """The ``questions_per_round`` (B) questions node ``node`` answers in round ``round_``.

        Raises:
            ConfigError: questions_per_round outside [1, 1024] or a position out of range.
        """
        if not 1 <= questions_per_round <= MAX_SLOTS:
            raise ConfigError(
                f"questions_per_round must be in [1, {MAX_SLOTS}], got {questions_per_round}",
                field="training.questions_per_round",
            )
        return [self.item(purpose, node, round_, slot) for slot in range(questions_per_round)]

    def eval_items(self, count: int, *, node: int = 0) -> list[TaskItem]:
        """``count`` held-out items (purpose ``eval``), disjoint from every training item.

        Raises:
            ConfigError: count < 1.
        """
        if count < 1:
            raise ConfigError(f"count must be >= 1, got {count}", field="eval.count")
        return [self.item("eval", node, i // MAX_SLOTS, i % MAX_SLOTS) for i in range(count)]
