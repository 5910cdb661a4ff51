"""A node's admission checks, and the one way to build its collector with them.

Owns the node-level checks of the collector's pipeline (:mod:`sapo_async.fabric.admission`
has the protocol and the wire-level ones): quarantine, preset and seed, sizes and the
producer-round cap, all run *before* the signature on what a message claims, plus an
operator's own check (``FabricSpec.extra_check``) after it. :class:`NodeDefences` holds the
defence state a node shares between its collector and its round (the quarantine and the
calibration), and :func:`build_collector` gives the collector its whole pipeline at
construction: nothing is patched into a live collector.

Why these run before the signature, on an unverified claim:

* quarantine: a forger cannot put a producer into quarantine (that takes drops of groups
  that verified as the producer's, judged in the round), so refusing a claim to be a
  quarantined producer needs no proof, and saves the signature check of its flood;
* preset, sizes and the producer-round cap: dictionary look-ups and lengths, cheaper than
  secp256k1 recovery, and refusing an unverified claim costs its claimed producer nothing it
  could have had: the same group is refused whoever sent it. The cap only *counts* groups the
  collector admitted (verified), so a forger cannot use up an honest producer's quota.

Refusals here do not feed the quarantine (they are unverified; and they cost the node no
work): the quarantine's one source of verdicts is the round's judgement of verified,
buffered groups (:meth:`~sapo_async.node.rounds.RoundLoop._choose`).

Deliberately does not know about models or the round: it reads specs and wire groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

from sapo_async.errors import RejectedInput
from sapo_async.fabric.admission import Arrival, Check, Stage
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.base import StartAt, Transport
from sapo_async.limits import PRODUCER_ROUNDS_REMEMBERED, QUARANTINE_MIN_EVENTS
from sapo_async.node.defence import Calibration
from sapo_async.node.leads import LeadRecord
from sapo_async.node.quarantine import Quarantine
from sapo_async.node.spec import NodeSpec
from sapo_async.tasks.source import dataset_seed
from sapo_async.tasks.spec import FamilySpec
from sapo_async.wire import RolloutGroup
from sapo_async.wire.reasons import RejectReason

__all__ = [
    "GroupCheck",
    "NodeDefences",
    "PresetCheck",
    "ProducerRoundCap",
    "QuarantineCheck",
    "SizeBounds",
    "build_collector",
]


@dataclass(frozen=True, slots=True)
class QuarantineCheck:
    """The claimed producer is not quarantined now [``quarantined``]."""

    quarantine: Quarantine
    stage: Stage = Stage.BEFORE_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        if self.quarantine.blocked(arrival.group.producer):
            raise RejectedInput(RejectReason.QUARANTINED)


@dataclass(frozen=True, slots=True)
class PresetCheck:
    """The task config is byte-equal to one of the receiver's own preset configs, with its
    swarm dataset seed [``task_outside_preset``]: a peer cannot choose how much work
    re-deriving its task costs."""

    allowed: dict[tuple[str, str], str]
    seed: int
    stage: Stage = Stage.BEFORE_SIGNATURE

    @classmethod
    def of(cls, families: Iterable[FamilySpec], seed: int) -> PresetCheck:
        """The check for a preset's families and a dataset seed (``swarm_seed << 52``)."""
        return cls({(f.family, f.digest): f.config_json for f in families}, seed)

    def __call__(self, arrival: Arrival) -> None:
        group = arrival.group
        ref = group.task
        config = self.allowed.get((ref.family, ref.config_digest))
        if config is None or config != group.task_config or ref.seed != self.seed:
            raise RejectedInput(
                RejectReason.TASK_OUTSIDE_PRESET,
                f"{ref.family} config {group.task_config[:80]!r} seed {ref.seed} is not one "
                "of this node's own",
            )


@dataclass(frozen=True, slots=True)
class SizeBounds:
    """The question and every completion text are within their character bounds
    [``prompt_too_long``, ``completion_too_long``] (the token bound is the round's:
    ``completion_too_many_tokens``)."""

    max_prompt_chars: int
    max_completion_chars: int
    stage: Stage = Stage.BEFORE_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        group = arrival.group
        if len(group.question) > self.max_prompt_chars:
            raise RejectedInput(
                RejectReason.PROMPT_TOO_LONG,
                f"{len(group.question)} > {self.max_prompt_chars} chars",
            )
        longest = max((len(c.text) for c in group.completions), default=0)
        if longest > self.max_completion_chars:
            raise RejectedInput(
                RejectReason.COMPLETION_TOO_LONG,
                f"{longest} > {self.max_completion_chars} chars",
            )


@dataclass(slots=True)
class ProducerRoundCap:
    """At most ``limit`` admitted groups per (producer, producer round)
    [``producer_round_flood``]; only admitted (verified) groups are counted.

    The counts are kept for at most :data:`~sapo_async.limits.PRODUCER_ROUNDS_REMEMBERED`
    producer rounds (a ``cachetools`` LRU cache), the least recently admitted or claimed
    forgotten first, so a many-key flood cannot grow them. A round being flooded is touched
    by its every group and is the last forgotten; a forgotten round's producer gets a new
    quota for it, which it could have had anyway from its next round or a new key (the cap
    bounds a round, not a person).
    """

    limit: int
    stage: Stage = Stage.BEFORE_SIGNATURE
    _counts: LRUCache[tuple[str, int], int] = field(
        default_factory=lambda: LRUCache(PRODUCER_ROUNDS_REMEMBERED)
    )

    def __call__(self, arrival: Arrival) -> None:
        group = arrival.group
        if self._counts.get((group.producer, group.producer_round), 0) >= self.limit:
            raise RejectedInput(
                RejectReason.PRODUCER_ROUND_FLOOD,
                f"more than {self.limit} groups in round {group.producer_round}",
            )

    def admitted(self, arrival: Arrival) -> None:
        """Count one admitted group."""
        round_ = (arrival.group.producer, arrival.group.producer_round)
        self._counts[round_] = self._counts.get(round_, 0) + 1


@dataclass(frozen=True, slots=True)
class GroupCheck:
    """An operator's ``check(group)`` (``FabricSpec.extra_check``, ``Swarm.join``), run last,
    on verified groups: returns to admit, raises ``RejectedInput`` with its own reason."""

    check: Callable[[RolloutGroup], None]
    stage: Stage = Stage.AFTER_SIGNATURE

    def __call__(self, arrival: Arrival) -> None:
        self.check(arrival.group)


@dataclass(slots=True)
class NodeDefences:
    """The defence state one node's collector and round share.

    Attributes:
        quarantine: producers refused for a while (verdicts come from the round only).
        calibration: the node's own completions, for the content thresholds.
        checks: the node's admission checks, in order (none with ``defence.active`` off,
            but an operator's ``extra_check`` stays).
        leads: which producers show a stock lead before their rewarded answers (None:
            ``defence.active`` off or ``stock_lead_share`` 0; :mod:`sapo_async.node.leads`).
    """

    quarantine: Quarantine
    calibration: Calibration
    checks: tuple[Check, ...]
    leads: LeadRecord | None = None

    @classmethod
    def build(cls, spec: NodeSpec, families: Sequence[FamilySpec]) -> NodeDefences:
        """The defences of a node with ``spec`` and its preset's ``families``."""
        d = spec.defence
        quarantine = Quarantine(d.quarantine_rate, QUARANTINE_MIN_EVENTS, d.quarantine_s)
        checks: list[Check] = []
        if d.active:
            checks.append(QuarantineCheck(quarantine))
            if d.preset_only:
                checks.append(PresetCheck.of(families, dataset_seed(spec.training.seed)))
            checks.append(SizeBounds(d.max_prompt_chars, d.max_completion_chars))
            checks.append(ProducerRoundCap(d.max_groups_per_producer_round))
        extra: Any = spec.fabric.extra_check
        if extra is not None:
            checks.append(GroupCheck(extra))
        leads = None
        if d.active and d.stock_lead_share > 0:
            leads = LeadRecord(d.stock_lead_share, probation=d.stock_lead_probation)
        calibration = Calibration(d, spec.training.max_new_tokens)
        return cls(quarantine, calibration, tuple(checks), leads)


def build_collector(
    spec: NodeSpec,
    transport: Transport,
    defences: NodeDefences,
    *,
    own_address: str,
    families: Sequence[str] | None = None,
    start: StartAt | None = None,
    name: str | None = None,
) -> Collector:
    """The node's collector, with its whole admission pipeline.

    The collector owns both staleness bounds: age (``training.max_age_s``) and round lag
    (``training.max_staleness_rounds``, at admission and when the buffer evicts), so the
    sampler never sees a stale group and checks none.

    Args:
        spec: the node's spec (training bounds, fabric shards).
        transport: where groups come from.
        defences: the node's defences (their checks join the pipeline).
        own_address: the node's address (its own groups are skipped).
        families: task families to subscribe to (``None``: all).
        start: where a new consumer starts (``None``: new messages only).
        name: the actor's name (default ``collector-<spec.name>``).
    """
    return Collector(
        transport,
        own_address=own_address,
        families=families,
        start=start,
        buffer_max_age_s=spec.training.max_age_s,
        max_round_lag=spec.training.max_staleness_rounds,
        checks=defences.checks,
        shards=spec.fabric.shard_plan(),
        name=name or f"collector-{spec.name}",
    )
