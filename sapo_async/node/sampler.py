"""Which question groups a node trains on each round: I local and J external.

A pure core: it takes groups already scored by the node's own verifier and returns the
training selection. It knows nothing of NATS, models or chains.

Policies:
    ``paper`` (default, SAPO §3): drop external groups whose rewards are all equal (their
        group-normalised advantages are all zero, so they carry no gradient), then sample J
        uniformly from the rest.
    ``topk`` (GenRL's variant, for comparison): the J external groups with the highest
        mean reward, ties broken at random.

Both honour a per-producer cap (at most ``per_producer_cap`` groups from one producer per
round), so no single peer can dominate a node's batch (a defence against the
"Hail to the Thief" poisoning attack, which needs roughly a quarter of a group).

Local groups: the first I of the node's own B groups, in the order generated (questions are
drawn at random, so this is a uniform choice, and with common random numbers the same
questions in every I/J configuration). The sampler does not filter them by reward, so a node
never picks its own informative groups over its uninformative ones; the trainer then drops
all-equal-reward groups of either origin before the step (they carry no policy gradient;
``TrainerConfig.drop_uninformative``), the same way in every configuration.

Fallback when fewer than J informative external groups are available: train on what
there is (J shrinks); the batch is never padded with extra local groups, so a node alone in
the swarm trains exactly like J = 0.

Staleness: not the sampler's. The collector owns both bounds (age, and a round lag of
``max_staleness_rounds`` behind the newest round admitted from a producer, at admission and
by evicting the buffer), so every candidate the sampler gets is fresh.

Lazy scoring: uniform sampling from the informative subset equals walking the candidates
in a uniformly random order and keeping the first J informative ones, so
:func:`select_external` scores candidates only until it has J, which saves the cost of
re-deriving and scoring every buffered group (about 10 to 15 % of round time in the CPU
prototype, LEARNING-NOTES).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from sapo_async.errors import RejectedInput

__all__ = [
    "ExternalSelection",
    "SamplerPolicy",
    "Scored",
    "is_informative",
    "select_external",
    "select_local",
]

SamplerPolicy = Literal["paper", "topk"]


class Scored(Protocol):
    """What the sampler needs of a scored group."""

    @property
    def producer(self) -> str: ...

    @property
    def rewards(self) -> Sequence[float]: ...


S = TypeVar("S", bound=Scored)
C = TypeVar("C")

_EPS = 1e-9


def is_informative(rewards: Sequence[float]) -> bool:
    """True when the rewards are not all equal, i.e. some advantage is non-zero."""
    return len(rewards) > 1 and (max(rewards) - min(rewards)) > _EPS


def select_local(groups: Sequence[C], count: int) -> list[C]:
    """The first ``count`` of the node's own groups (see the module docstring)."""
    if count < 0:
        raise ValueError(f"local count must be >= 0, got {count}")
    return list(groups[:count])


@dataclass
class ExternalSelection(Generic[S]):
    """Result of :func:`select_external`.

    Attributes:
        chosen: the selected, scored external groups.
        scored: how many candidates were scored to find them.
        dropped_uninformative: scored candidates dropped for all-equal rewards.
        dropped_capped: candidates skipped because their producer hit the cap.
        failed: candidates whose scoring raised (re-derivation mismatch and the like),
            by reason; they are counted, never raised.
    """

    chosen: list[S] = field(default_factory=list)
    scored: int = 0
    dropped_uninformative: int = 0
    dropped_capped: int = 0
    failed: Counter[str] = field(default_factory=Counter)


def select_external(
    candidates: Iterable[C],
    count: int,
    score: Callable[[C], S],
    *,
    rng: random.Random,
    policy: SamplerPolicy = "paper",
    per_producer_cap: int | None = None,
    producer_of: Callable[[C], str] | None = None,
    on_error: Callable[[C, RejectedInput], str] | None = None,
) -> ExternalSelection[S]:
    """Choose up to ``count`` external groups.

    Args:
        candidates: unscored external groups (already verified and not stale).
        count: J, the number wanted.
        score: scores one candidate with the node's own verifier.
        rng: the node's random source (seeded per node and round for common random numbers).
        policy: ``"paper"`` or ``"topk"``.
        per_producer_cap: at most this many groups from one producer; None for no cap.
        producer_of: reads a candidate's producer before scoring (lets capped producers be
            skipped without scoring); defaults to ``candidate.producer``.
        on_error: maps a refusal (:class:`~sapo_async.errors.RejectedInput`) while
            scoring to a reason label; without it the refusal propagates. Any other
            exception is a bug and always propagates.

    Returns:
        The selection, with counters for the round report.

    Raises:
        ValueError: ``count`` is negative, the policy is unknown, or the cap is below 1.
    """
    if count < 0:
        raise ValueError(f"external count must be >= 0, got {count}")
    if policy not in ("paper", "topk"):
        raise ValueError(f"sampler policy must be 'paper' or 'topk', got {policy!r}")
    if per_producer_cap is not None and per_producer_cap < 1:
        raise ValueError(f"per_producer_cap must be >= 1 or None, got {per_producer_cap}")
    result: ExternalSelection[S] = ExternalSelection()
    if count == 0:
        return result
    order = list(candidates)
    rng.shuffle(order)
    read_producer = producer_of or (lambda c: str(getattr(c, "producer")))  # noqa: B009
    taken: Counter[str] = Counter()
    informative: list[S] = []
    for candidate in order:
        producer = read_producer(candidate)
        if per_producer_cap is not None and taken[producer] >= per_producer_cap:
            result.dropped_capped += 1
            continue
        try:
            scored = score(candidate)
        except RejectedInput as exc:
            if on_error is None:
                raise
            result.failed[on_error(candidate, exc)] += 1
            continue
        result.scored += 1
        if not is_informative(scored.rewards):
            result.dropped_uninformative += 1
            continue
        if policy == "paper":
            informative.append(scored)
            taken[producer] += 1
            if len(informative) == count:
                break
        else:
            informative.append(scored)
    if policy == "topk":
        # Stable sort on a random order = ties broken at random; then apply the cap.
        informative.sort(key=lambda g: -sum(g.rewards) / len(g.rewards))
        chosen: list[S] = []
        for g in informative:
            if per_producer_cap is not None and taken[g.producer] >= per_producer_cap:
                result.dropped_capped += 1
                continue
            taken[g.producer] += 1
            chosen.append(g)
            if len(chosen) == count:
                break
        informative = chosen
    result.chosen = informative
    return result
