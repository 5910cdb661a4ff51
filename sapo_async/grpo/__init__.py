"""GRPO: pure advantage/loss maths (:mod:`.core`) and the torch trainer (:mod:`.trainer`)."""

from sapo_async.grpo.core import (
    AGGREGATIONS,
    AdvantageMode,
    Aggregation,
    LossTerms,
    aggregate,
    group_advantages,
    k3_kl,
    policy_loss,
    truncated_is_weights,
)
from sapo_async.grpo.trainer import (
    ScoredCompletion,
    ScoredGroup,
    StepMetrics,
    Trainer,
    TrainerConfig,
)

__all__ = [
    "AGGREGATIONS",
    "AdvantageMode",
    "Aggregation",
    "LossTerms",
    "ScoredCompletion",
    "ScoredGroup",
    "StepMetrics",
    "Trainer",
    "TrainerConfig",
    "aggregate",
    "group_advantages",
    "k3_kl",
    "policy_loss",
    "truncated_is_weights",
]
