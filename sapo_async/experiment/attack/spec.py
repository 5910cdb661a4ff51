"""What the attack experiment runs and records: :class:`AttackSpec`, :class:`RunMeasure`.

Its own module so that the runner (:mod:`.runner`) and the summary (:mod:`.summary`) both
import it and neither imports the other's callers (no import cycle).

The defences are a node's own: :attr:`AttackSpec.defence` is a
:class:`~sapo_async.node.spec_defence.DefenceSpec` whose default is ``DefenceSpec()``, and
the experiment declares no defence setting or default of its own. It once did (eight
settings with defaults of their own, chosen to keep old matrices resumable), and they
drifted from a node's: a recipe that meant "a node's defaults" measured a node nobody runs.
An override is named by the spec's own key (:func:`defence_of`, ``--defence KEY=VALUE``),
so a setting has one name from node.toml to the experiment. Runs recorded with the old
settings still load (:mod:`.record`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.experiment.attack.absurd import Absurd
from sapo_async.experiment.attack.base import Attack
from sapo_async.experiment.attack.capped import Capped
from sapo_async.experiment.attack.diluted import Diluted
from sapo_async.experiment.attack.false_step import FalseStep
from sapo_async.experiment.attack.filler import Filler
from sapo_async.experiment.attack.flood import Flood
from sapo_async.experiment.attack.inject import Inject
from sapo_async.experiment.attack.length import Length
from sapo_async.experiment.attack.longest import Longest
from sapo_async.experiment.attack.post_selected import PostSelected
from sapo_async.experiment.attack.sleeper import Sleeper
from sapo_async.experiment.attack.stock_leads import StockLeads
from sapo_async.experiment.attack.sybil import Sybil
from sapo_async.experiment.attack.tokens import Tokens
from sapo_async.experiment.attack.trigger import Trigger
from sapo_async.experiment.attack.trigger_nonsense import TriggerNonsense
from sapo_async.experiment.attack.wrong import Wrong
from sapo_async.node.spec_defence import DefenceSpec
from sapo_async.tasks.spec import FamilySpec

__all__ = [
    "ATTACKS",
    "HELD_OUT_ATTACKS",
    "KNOWN_ATTACKS",
    "LENGTH_ATTACKS",
    "LITERATURE_ATTACKS",
    "RATIO_ATTACKS",
    "TAIL_CHARS",
    "AttackSpec",
    "RunMeasure",
    "config_label",
    "defence_of",
    "honest_only_label",
    "make_attack",
    "quick",
]

ATTACKS = ("inject", "tokens", "length", "flood", "absurd", "wrong", "filler")
"""The default matrix: what ``AttackSpec()`` and ``--attacks all`` run (unchanged since the
recorded matrices, so they resume and compare as they were)."""

LITERATURE_ATTACKS = ("trigger", "stock_leads", "longest", "capped", "post_selected", "sybil")
"""Issue 57's attacks from the literature and live networks that defaults may be tuned on
(docs/security.md, "Attacks from the literature and the held-out set"); a matrix runs them
when it names them (``--attacks trigger,...``)."""

HELD_OUT_ATTACKS = ("trigger_nonsense", "false_step", "sleeper", "diluted")
"""The held-out attacks, named on 2026-12-06 before any default was tuned against the new
attacks (``diluted`` on 2026-12-07, before its first run and before evidence before
influence was measured; ``trigger_nonsense``'s first result was read before that change,
so for it that change is not blind): no default is tuned on them. They are run once,
after the defaults are settled, named explicitly, and reported apart from the attacks the
defaults were tuned on; a default chosen after seeing them would make them one more
tuned-on attack, and the held-out result would no longer say how the defences meet an
attack they were not shaped to."""

KNOWN_ATTACKS = ATTACKS + LITERATURE_ATTACKS + HELD_OUT_ATTACKS
"""Every attack a matrix may name (:func:`make_attack` builds each)."""

RATIO_ATTACKS = frozenset({"length", "flood", "absurd", "longest", "capped"})
"""Attacks measured as a ratio to the no-attack run; the others as a payload rate."""

LENGTH_ATTACKS = frozenset({"length", "longest", "capped"})
"""Ratio attacks whose measure is the honest mean completion length (the others: CPU)."""


def config_label(config: tuple[int, int], nodes: int | None = None) -> str:
    """A run's ``config``: ``"I/J"``, and ``"I/J@n"`` for a swarm of ``n`` nodes other
    than the matrix's (the honest-only control: the attack runs' honest nodes alone)."""
    label = f"{config[0]}/{config[1]}"
    return label if nodes is None else f"{label}@{nodes}"


def honest_only_label(spec: AttackSpec) -> str:
    """The ``config`` of ``spec``'s honest-only control: its I/J, its honest nodes alone."""
    return config_label((spec.local, spec.external), spec.nodes - spec.attackers)


TAIL_CHARS = 64
"""How much of the text after an honest completion's answer tag a run records."""

PROMPT_STYLES = ("auto", "compact", "instruct")


def make_attack(name: str, max_new_tokens: int = 16, tokenizer: Any = None) -> Attack:
    """The named attack, sized for ``max_new_tokens`` tokens of ``tokenizer`` (None: the
    tiny model's, one token per character)."""
    attacks: dict[str, Callable[[], Attack]] = {
        "inject": Inject,
        "tokens": Tokens,
        "length": lambda: Length(max_new_tokens, tokenizer),
        "flood": Flood,
        "absurd": Absurd,
        "wrong": Wrong,
        "filler": Filler,
        "trigger": Trigger,
        "stock_leads": StockLeads,
        "longest": Longest,
        "capped": lambda: Capped(max_new_tokens, tokenizer),
        "post_selected": PostSelected,
        "sybil": Sybil,
        "trigger_nonsense": TriggerNonsense,
        "false_step": FalseStep,
        "sleeper": Sleeper,
        "diluted": Diluted,
    }
    return attacks[name]()


@dataclass(frozen=True, slots=True)
class AttackSpec:
    """The experiment.

    Attributes:
        attacks: which attacks to run: by default :data:`ATTACKS`; any of
            :data:`KNOWN_ATTACKS` by name (the held-out ones only once the defaults are
            settled, :data:`HELD_OUT_ATTACKS`).
        rounds: rounds per run.
        seeds: swarm seeds.
        nodes / attackers: swarm size and how many of them attack.
        questions_per_round / completions_per_question: B and L.
        local / external: I and J of every node.
        lr: AdamW learning rate.
        max_new_tokens: completion cap.
        regime: the tiny model's warm start (and the reward regime).
        model: ``"tiny"`` (the project's 0.86 M character model of ``regime``) or a packaged
            model's name (``"smollm2-135m"``), loaded once per run and copied per node.
        train_layers: train only the last N transformer blocks (None: every parameter).
        tasks: a preset name or families; None: ``"cpu"`` for the tiny model,
            ``"cpu_easy"`` (two one-digit terms of chain_sum) for a real one.
        prompt_style: ``"auto"`` (compact for tiny, instruct with the chat template for a
            real model), ``"compact"`` or ``"instruct"``.
        transport: ``"nats"`` (a private nats-server with JetStream per run) or
            ``"memory"`` (the in-process broker).
        defence: what every node refuses from peers in the "defences on" arm, a node's
            own :class:`~sapo_async.node.spec_defence.DefenceSpec` (node.toml's
            ``[defence]``) as it is: its defaults are a node's, and an override names the
            spec's own key (:func:`defence_of`). The "defences off" arm runs the same spec
            with ``active`` off (:meth:`AttackSpec.defence_in`).
        eval_questions: after the last round, each honest node answers this many held-out
            questions (the same for every node and run; 0: none): its reward measured on
            many more answers than its rounds give, so one run's ratio is less noisy.
        eval_completions: answers sampled per held-out question.
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
    model: str = "tiny"
    train_layers: int | None = None
    tasks: str | tuple[FamilySpec, ...] | None = None
    prompt_style: str = "auto"
    transport: str = "nats"
    defence: DefenceSpec = field(default_factory=DefenceSpec)
    eval_questions: int = 0
    eval_completions: int = 8

    def __post_init__(self) -> None:
        from sapo_async.experiment.lockstep import TRANSPORTS
        from sapo_async.policy.models.packaged import packaged_model_names
        from sapo_async.tasks.spec import PRESETS

        def bad(name: str, allowed: str) -> ConfigError:
            return ConfigError(
                f"{name} {getattr(self, name)!r} is not allowed: {allowed}", field=name
            )

        models = ("tiny", *packaged_model_names())
        if self.model not in models:
            raise bad("model", f"one of {', '.join(models)}")
        if self.transport not in TRANSPORTS:
            raise bad("transport", f"one of {', '.join(TRANSPORTS)}")
        if self.prompt_style not in PROMPT_STYLES:
            raise bad("prompt_style", f"one of {', '.join(PROMPT_STYLES)}")
        if isinstance(self.tasks, str) and self.tasks not in PRESETS:
            raise bad("tasks", f"a preset ({', '.join(PRESETS)}) or family names")
        if isinstance(self.tasks, tuple):
            import reasoning_gym

            families = [f.family for f in self.tasks]
            unknown_families = [f for f in families if f not in reasoning_gym.factory.DATASETS]
            if not families or unknown_families:
                raise ConfigError(
                    f"tasks: unknown family {unknown_families[0] if families else None!r}; "
                    f"allowed: a preset ({', '.join(PRESETS)}) or reasoning-gym family names",
                    field="tasks",
                )
        if self.nodes < 2:
            raise bad("nodes", "at least 2")
        if not 1 <= self.attackers < self.nodes:
            raise bad("attackers", f"at least 1 and fewer than nodes ({self.nodes})")
        for name in ("rounds", "questions_per_round", "local", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise bad(name, "at least 1")
        if self.completions_per_question < 2:
            raise bad("completions_per_question", "at least 2 (GRPO compares completions)")
        if self.external < 0:
            raise bad("external", "0 or more")
        if self.train_layers is not None and self.train_layers < 1:
            raise bad("train_layers", "at least 1, or unset to train every parameter")
        if not self.lr > 0:
            raise bad("lr", "a positive number")
        if self.eval_questions < 0:
            raise bad("eval_questions", "0 (no held-out evaluation) or more")
        if self.eval_completions < 1:
            raise bad("eval_completions", "at least 1")
        if not isinstance(self.defence, DefenceSpec):
            raise bad("defence", "a DefenceSpec (node.toml's [defence])")
        unknown = set(self.attacks) - set(KNOWN_ATTACKS)
        if unknown:
            raise ConfigError(
                f"unknown attack {sorted(unknown)[0]!r}; allowed: {', '.join(KNOWN_ATTACKS)}",
                field="attacks",
            )

    @property
    def real(self) -> bool:
        """A packaged model rather than the tiny one."""
        return self.model != "tiny"

    def task_setting(self) -> str | tuple[FamilySpec, ...]:
        """``tasks`` as NodeSpec takes it, the default resolved (see the attributes)."""
        if self.tasks is not None:
            return self.tasks
        return "cpu_easy" if self.real else "cpu"

    def defence_in(self, defences: bool) -> DefenceSpec:
        """Every node's defence in the "defences on" (``True``) or "off" arm: ``defence``
        as it is, or the same with ``active`` off."""
        return self.defence if defences else self.defence.replace(active=False)

    def record(self) -> dict[str, Any]:
        """The spec as JSON holds it (``runs.jsonl``'s first line, ``summary.json``'s
        ``spec``): every field, ``defence`` as the dict of every one of its settings, so
        a record says exactly which defences ran."""
        fields = asdict(self)  # the defence copied as it is: a model, not a dataclass
        fields["defence"] = self.defence.model_dump(mode="json")
        record: dict[str, Any] = json.loads(json.dumps(fields))  # tuples as lists
        return record


def defence_of(settings: Sequence[str]) -> DefenceSpec:
    """A node's :class:`~sapo_async.node.spec_defence.DefenceSpec` with ``settings``
    changed, each ``KEY=VALUE`` with a key of node.toml's ``[defence]`` (the spec's own
    field names, generated from ``DefenceSpec.model_fields``), the value text converted
    and checked by the spec itself, as a ``SAPO_DEFENCE__<KEY>`` variable's is
    (``true``/``false``, numbers); a key given twice, the last wins.

    Raises:
        ConfigError: not ``KEY=VALUE``, an unknown key (the allowed ones named), or a value
            the spec refuses (the key and what is allowed named), in one line.
    """
    fields = DefenceSpec.model_fields
    changes: dict[str, Any] = {}  # text the spec converts (as SAPO_DEFENCE__*)
    for item in settings:
        key, equals, value = item.partition("=")
        key = key.strip()
        if not equals or not key:
            raise ConfigError(
                f"a defence setting is KEY=VALUE with a key of node.toml's [defence], got {item!r}",
                field="defence",
            )
        known = key in fields or key in DefenceSpec.renamed or key in DefenceSpec.retired
        if not known:  # an old name is left to the spec, which says what became of it
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown defence setting {key!r}{hint}; allowed: {', '.join(fields)}",
                field="defence",
            )
        changes[key] = value.strip()
    return DefenceSpec(**changes)


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
        config: ``"I/J"`` (``"I/J@n"``: a swarm of ``n`` nodes, see :func:`config_label`).
        honest: indices of the honest nodes.
        rewards: ``rewards[node][round]`` for every node (attackers included).
        payload: per round, the fraction of honest own completions carrying the payload.
        payload_base: no-attack runs only: per payload attack (``inject``, ``tokens``,
            ``wrong``), per round, the fraction of honest own completions its detector
            matches with no attacker present (the payload rate's floor).
        length: per round, the honest own completions' mean length (tokens).
        tails: per round, what the honest own completions hold after their last closing
            answer tag, where anything (stripped, at most :data:`TAIL_CHARS` characters):
            a payload detector written later can be applied to a recorded run.
        round_s: per round, CPU seconds of the run's process without the attackers' own
            share and train (process time: robust to other jobs on a shared machine).
            Kept for comparison with earlier results; it undercounts a flood, since honest
            collectors ingest the flood in the same event loop while the attackers publish.
        round_cpu_s: per round, CPU seconds of the run's process over the whole round,
            nothing subtracted (what the flood and absurd measures use).
        round_cpu_honest_s: per round, the honest nodes' own CPU seconds: the round less
            the attackers' own work, each collector's ingest charged to its node
            (:class:`~sapo_async.experiment.attack.measure.RoundClock`).
        server_cpu_s: per round, CPU seconds of the nats-server process (empty in memory).
        round_wall_s: wall-clock seconds of the round without the attackers' share and train.
        round_total_wall_s: wall-clock seconds of the whole round (what sizes a matrix).
        trained_external: external groups honest nodes trained on, by origin
            (``honest`` / ``attacker``).
        left_out: completions honest nodes' scoring left out of external groups before
            judging them, by origin and reason (``{"honest": {"stock_lead": n}}``:
            :attr:`~sapo_async.node.report.RoundReport.external_left_out`); None in runs
            recorded before it was kept.
        held: per round, the external groups each honest node left in its buffer unjudged,
            summed over the honest nodes, by reason (``uncalibrated``, ``probation``, ``evidence``:
            :attr:`~sapo_async.node.report.RoundReport.external_held_by`; a group held for
            three rounds counts three times); None in runs recorded before it was kept.
        dropped: honest nodes' refusals by reason (admission and after).
        received: external groups honest nodes' collectors saw.
        admitted: of those, the ones honest nodes' collectors admitted (the denominator of
            the per-check false-positive rates after admission).
        honest_groups_dropped: groups honest nodes refused by a defence, from any producer
            (named for the no-attack run, where every producer is honest and this over
            ``honest_groups_judged`` is the false-positive rate; in an attack run it counts
            the attackers' groups too).
        honest_groups_judged: groups honest nodes admitted or refused by a defence, from any
            producer (the false-positive rate's denominator in a no-attack run).
        dropped_by_round: ``honest_groups_dropped`` round by round (a no-attack run's false
            positives over time); None in runs recorded before it was kept.
        quarantined: producers quarantined by some honest node at the end.
        peak_rss_mb: the process's peak resident memory.
        seconds: wall time.
        eval_rewards: with ``eval_questions``, the mean reward on the held-out questions
            after the last round of each node that is honest in the attack runs (the first
            ``nodes - attackers``, in node order, also in a no-attack run); empty where not
            measured.
        environment: what the run ran on
            (:func:`sapo_async.experiment.environment.environment`, with the real model's
            weights); empty in runs recorded before it was kept.
    """

    attack: str
    defences: bool
    seed: int
    config: str
    honest: list[int]
    rewards: list[list[float]] = field(default_factory=list)
    payload: list[float] = field(default_factory=list)
    payload_base: dict[str, list[float]] = field(default_factory=dict)
    length: list[float] = field(default_factory=list)
    tails: list[list[str]] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)
    round_cpu_s: list[float] = field(default_factory=list)
    round_cpu_honest_s: list[float] = field(default_factory=list)
    server_cpu_s: list[float] = field(default_factory=list)
    round_wall_s: list[float] = field(default_factory=list)
    round_total_wall_s: list[float] = field(default_factory=list)
    trained_external: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, dict[str, int]] | None = None
    held: list[dict[str, int]] | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    received: int = 0
    admitted: int = 0
    honest_groups_dropped: int = 0
    honest_groups_judged: int = 0
    dropped_by_round: list[int] | None = None
    quarantined: int = 0
    peak_rss_mb: float = 0.0
    seconds: float = 0.0
    eval_rewards: list[float] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
