"""GRPO: pure advantage/loss maths (:mod:`.core`), scored groups to tensors (:mod:`.batch`)
and the torch trainer (:mod:`.trainer`).

Names load on first use (:mod:`sapo_async._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports

if TYPE_CHECKING:
    from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup
    from sapo_async.policy.grpo.config import TrainerConfig
    from sapo_async.policy.grpo.core import (
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
    from sapo_async.policy.grpo.trainer import StepMetrics, Trainer

_LAZY = {
    "AGGREGATIONS": "sapo_async.policy.grpo.core",
    "AdvantageMode": "sapo_async.policy.grpo.core",
    "Aggregation": "sapo_async.policy.grpo.core",
    "LossTerms": "sapo_async.policy.grpo.core",
    "ScoredCompletion": "sapo_async.policy.grpo.batch",
    "ScoredGroup": "sapo_async.policy.grpo.batch",
    "StepMetrics": "sapo_async.policy.grpo.trainer",
    "Trainer": "sapo_async.policy.grpo.trainer",
    "TrainerConfig": "sapo_async.policy.grpo.config",
    "aggregate": "sapo_async.policy.grpo.core",
    "group_advantages": "sapo_async.policy.grpo.core",
    "k3_kl": "sapo_async.policy.grpo.core",
    "policy_loss": "sapo_async.policy.grpo.core",
    "truncated_is_weights": "sapo_async.policy.grpo.core",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

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
