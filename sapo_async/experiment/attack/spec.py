"""What the attack experiment runs and records: :class:`AttackSpec`, :class:`RunMeasure`.

Its own module so that the runner (:mod:`.runner`) and the summary (:mod:`.summary`) both
import it and neither imports the other's callers (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sapo_async.experiment.attack.absurd import Absurd
from sapo_async.experiment.attack.base import Attack
from sapo_async.experiment.attack.flood import Flood
from sapo_async.experiment.attack.inject import Inject
from sapo_async.experiment.attack.length import Length
from sapo_async.experiment.attack.tokens import Tokens
from sapo_async.experiment.attack.wrong import Wrong

__all__ = ["ATTACKS", "AttackSpec", "RunMeasure", "make_attack", "quick"]

ATTACKS = ("inject", "tokens", "length", "flood", "absurd", "wrong")


def make_attack(name: str, max_new_tokens: int = 16) -> Attack:
    """The named attack, sized for ``max_new_tokens``."""
    attacks: dict[str, Callable[[], Attack]] = {
        "inject": Inject,
        "tokens": Tokens,
        "length": lambda: Length(max_new_tokens),
        "flood": Flood,
        "absurd": Absurd,
        "wrong": Wrong,
    }
    return attacks[name]()


@dataclass(frozen=True, slots=True)
class AttackSpec:
    """The experiment.

    Attributes:
        attacks: which attacks to run.
        rounds: rounds per run.
        seeds: swarm seeds.
        nodes / attackers: swarm size and how many of them attack.
        questions_per_round / completions_per_question: B and L.
        local / external: I and J of every node.
        lr: AdamW learning rate.
        max_new_tokens: completion cap.
        regime: the tiny model's warm start.
    """

    attacks: tuple[str, ...] = ATTACKS
    rounds: int = 12
    seeds: tuple[int, ...] = (0, 1)
    nodes: int = 8
    attackers: int = 2
    questions_per_round: int = 4
    completions_per_question: int = 8
    local: int = 2
    external: int = 2
    lr: float = 3e-4
    max_new_tokens: int = 16
    regime: str = "dense"


def quick(spec: AttackSpec) -> AttackSpec:
    """A seconds-long version for tests: 4 nodes (1 attacker), 3 rounds, one seed, B=2, 1/1."""
    return replace(
        spec, rounds=3, seeds=(0,), nodes=4, attackers=1, questions_per_round=2, local=1, external=1
    )


@dataclass(slots=True)
class RunMeasure:
    """One run, measured on the honest nodes.

    Attributes:
        attack: the attack (``"none"`` for the no-attack run).
        defences: defences on.
        seed: swarm seed.
        config: ``"I/J"``.
        honest: indices of the honest nodes.
        rewards: ``rewards[node][round]`` for every node (attackers included).
        payload: per round, the fraction of honest own completions carrying the payload.
        length: per round, the honest own completions' mean length (tokens).
        round_s: per round, CPU seconds of the run's process without the attackers' own
            share and train (process time: robust to other jobs on a shared machine).
        round_wall_s: the same in wall-clock seconds.
        trained_external: external groups honest nodes trained on, by origin
            (``honest`` / ``attacker``).
        dropped: honest nodes' refusals by reason (admission and after).
        received: external groups honest nodes' collectors saw.
        admitted: of those, the ones honest nodes' collectors admitted (the denominator of
            the per-check false-positive rates after admission).
        honest_groups_dropped: groups from honest producers refused by honest nodes.
        honest_groups_judged: groups from honest producers honest nodes admitted.
        quarantined: producers quarantined by some honest node at the end.
        peak_rss_mb: the process's peak resident memory.
        seconds: wall time.
    """

    attack: str
    defences: bool
    seed: int
    config: str
    honest: list[int]
    rewards: list[list[float]] = field(default_factory=list)
    payload: list[float] = field(default_factory=list)
    length: list[float] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)
    round_wall_s: list[float] = field(default_factory=list)
    trained_external: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    received: int = 0
    admitted: int = 0
    honest_groups_dropped: int = 0
    honest_groups_judged: int = 0
    quarantined: int = 0
    peak_rss_mb: float = 0.0
    seconds: float = 0.0
