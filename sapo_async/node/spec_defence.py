"""The node spec's part for what a node refuses from peers: ``[defence]`` in node.toml.

Owns :class:`DefenceSpec` (re-exported by :mod:`sapo_async.node.spec`). As with the other
parts (:mod:`.spec_parts`), node.toml's section is this model itself: a setting has one
name, one default, one bound and one description from the file to the code that uses it,
and a bad value raises :class:`~sapo_async.errors.ConfigError` naming the field and what is
allowed. What each defence does and what it cannot stop: docs/security.md.
"""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import Field, model_validator

from sapo_async.policy.settings import Settings

__all__ = ["DefenceSpec"]


class DefenceSpec(Settings):
    """What a node refuses from validly signed peers (docs/security.md, a heading each).

    The same model is node.toml's ``[defence]`` section: each field's default, bounds and
    description are here only, and a field is here only if a volunteer may need to change
    it. ``active`` is the master switch (the attack experiment's "defences off"; the
    collector's wire checks and the trained-hash rule stay on regardless); the length guard
    also drops a rewarded completion longer than the node's own ``max_new_tokens``; a
    producer is quarantined once at least ``quarantine_rate`` of at least
    :data:`~sapo_async.limits.QUARANTINE_MIN_EVENTS` of its judged groups were dropped.

    The thresholds no volunteer has had a reason to change (the quantiles, margins and
    factors of the plausibility check and the length and brevity guards) are named
    constants in :mod:`sapo_async.limits`, each beside the measurement that set it. Settings
    measured not to help were removed (:attr:`retired`: a file that still names one is
    refused with one line saying so; CHANGELOG.md).
    """

    part: ClassVar[str] = "defence"
    retired: ClassVar[dict[str, str]] = {
        **dict.fromkeys(
            ("answer_ends_completion", "drop_after_answer", "tail_share", "balanced_draw"),
            "measured not to help on SmolLM2 and off by default; see CHANGELOG.md",
        ),
        **{
            name: f"fixed in code as sapo_async.limits.{name.upper()}"
            for name in (
                "plausibility_quantile",
                "plausibility_margin",
                "plausibility_low_tokens",
                "length_factor",
                "length_quantile",
                "brevity_factor",
                "brevity_quantile",
                "quarantine_min_events",
            )
        },
    }

    active: bool = Field(default=True, description="All content and resource defences on or off.")
    preset_only: bool = Field(
        default=True,
        description="Admit only task configs of this node's own preset and swarm seed.",
    )
    max_prompt_chars: int = Field(default=8192, ge=1, description="Longest question admitted.")
    max_completion_chars: int = Field(
        default=8192, ge=1, description="Longest completion admitted."
    )
    max_groups_per_producer_round: int = Field(
        default=64, ge=1, description="Most groups admitted from one producer round."
    )
    plausibility: bool = Field(
        default=True,
        description="Drop groups this node's own model finds implausible: from a peer of "
        "its model, a rewarded completion its own sampling would give with p < 0.001 (a "
        "token or a run of tokens out of place); from another model's, one whose mean token "
        "log-prob, or mean of its 3 least likely tokens, is below its own completions' 1 % "
        "quantile less 1 nat.",
    )
    cut_after_answer: bool = Field(
        default=True,
        description="Screen and train a peer's completion only through its closing "
        "answer tag, stopped there (the verifier never read what follows).",
    )
    stock_lead_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Leave out a peer's completions that show its stock lead: the same "
        "words before at least this share of the answers it was rewarded for (at least 8, "
        "in its last 16 groups, on 3 or more questions; 0: off; docs/security.md).",
    )
    stock_lead_probation: bool = Field(
        default=True,
        description="With stock_lead_share on, once the same words precede a peer's "
        "rewarded answers to two questions, train none of its groups until the record can "
        "read its share (8 answers on 3 questions); they wait in the buffer.",
    )
    length_guard: bool = Field(
        default=True,
        description="Drop needlessly long rewarded completions, and rewarded ones that "
        "never stopped (truncated at the cap).",
    )
    brevity_guard: bool = Field(
        default=True,
        description="Drop a group whose rewarded completion shows far less text before its "
        "answer than the node's own completions do (a bare answer).",
    )
    repetition_limit: int = Field(
        default=12,
        ge=0,
        description="Drop a rewarded completion that repeats a pattern of 1 to "
        "4 tokens over this many tokens (padding; 0: off).",
    )
    calibration_min: int = Field(
        default=32,
        ge=1,
        description="Own completions a family needs before its thresholds apply "
        "(another model's peers' groups of the family wait until then).",
    )
    quarantine_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Quarantine a producer when this share of its groups...",
    )
    quarantine_s: float = Field(default=600.0, ge=0, description="...were dropped, for this long.")

    @model_validator(mode="after")
    def _together(self) -> Self:
        # Probation is on by default: `stock_lead_share = 0` alone turns the record and
        # its probation off; only probation asked for in so many words contradicts it.
        asked = "stock_lead_probation" in self.model_fields_set
        if asked and self.stock_lead_probation and not self.stock_lead_share:
            raise ValueError(
                "stock_lead_probation = true needs stock_lead_share above 0 (the record "
                "that judges a peer): set both, or leave probation off"
            )
        return self
