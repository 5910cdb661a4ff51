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
    """What a node refuses from validly signed peers (docs/security.md, one paragraph each).

    The same model is node.toml's ``[defence]`` section: each field's default, bounds and
    description are here only. ``active`` is the master switch (the attack experiment's
    "defences off"; the collector's wire checks and the trained-hash rule stay on
    regardless); the length guard also drops a rewarded completion longer than the node's
    own ``max_new_tokens``; a producer is quarantined once at least ``quarantine_rate`` of
    at least ``quarantine_min_events`` of its judged groups were dropped.
    """

    part: ClassVar[str] = "defence"

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
        default=True, description="Drop groups this node's own model finds implausible."
    )
    plausibility_quantile: float = Field(
        default=0.01, gt=0, le=1, description="Quantile of own completions' mean log-prob..."
    )
    plausibility_margin: float = Field(default=1.0, ge=0, description="...minus this many nats.")
    plausibility_low_tokens: int = Field(
        default=3,
        ge=0,
        description="Screen the mean of a completion's this many least likely tokens "
        "the same way (0: off).",
    )
    answer_ends_completion: bool = Field(
        default=False,
        description="Score 0 for text after the closing answer tag, own and peers' "
        "(where injected payloads sit).",
    )
    cut_after_answer: bool = Field(
        default=True,
        description="Screen and train a peer's completion only through its closing "
        "answer tag, stopped there (the verifier never read what follows).",
    )
    drop_after_answer: bool = Field(
        default=False,
        description="Leave a peer's completion with text after its closing answer tag out "
        "of training altogether (before the cut); its group is judged by the rest.",
    )
    tail_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Do as drop_after_answer for a peer once this share of the answers "
        "it was rewarded for (at least 8, in its last 16 groups) carried text after the "
        "closing tag (0: off; measured on SmolLM2 in docs/security.md).",
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
        description="With stock_lead_share on, train no group of a peer until the record "
        "can judge it (rewarded answers on 3 questions: 8 of them, or no words repeated "
        "before answers to two); its groups wait in the buffer.",
    )
    balanced_draw: bool = Field(
        default=False,
        description="Draw peers' groups least served producer first (over the last 32 "
        "trained), so always-informative groups win a producer's share, not every slot.",
    )
    length_guard: bool = Field(
        default=True, description="Drop needlessly long rewarded completions."
    )
    length_factor: float = Field(
        default=1.5, ge=1, description="Longest rewarded completion, times own rewarded length..."
    )
    length_quantile: float = Field(default=0.95, gt=0, le=1, description="...at this quantile.")
    brevity_guard: bool = Field(
        default=True,
        description="Drop a group whose rewarded completion shows far less text before its "
        "answer than the node's own completions do (a bare answer).",
    )
    brevity_factor: float = Field(
        default=2.0, ge=1, description="Fewest characters before the answer: own, over this..."
    )
    brevity_quantile: float = Field(default=0.05, gt=0, le=1, description="...at this quantile.")
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
        "(peers' groups of the family wait until then).",
    )
    quarantine_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Quarantine a producer when this share of its groups...",
    )
    quarantine_min_events: int = Field(default=8, ge=1, description="...of at least this many...")
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
