"""sapo_async: decentralised RL post-training with collective experience sharing (SAPO).

The public API is what ``__all__`` lists; everything else is implementation.
"""

from __future__ import annotations

from sapo_async.errors import (
    ActorError,
    ActorFailed,
    ActorStopped,
    CheckpointError,
    CommitmentRejected,
    ConfigError,
    GenerationError,
    LedgerError,
    LedgerUnavailable,
    PublishError,
    RejectedInput,
    SapoError,
    TrainingError,
    TransportError,
    TransportUnavailable,
    WeightSyncError,
)
from sapo_async.node import Node, RoundReport
from sapo_async.swarm import Swarm
from sapo_async.wire import Completion, RolloutGroup, SamplingParams, SignedGroup, TaskRef

__version__ = "0.1.0"

__all__ = [
    "ActorError",
    "ActorFailed",
    "ActorStopped",
    "CheckpointError",
    "CommitmentRejected",
    "Completion",
    "ConfigError",
    "GenerationError",
    "LedgerError",
    "LedgerUnavailable",
    "Node",
    "PublishError",
    "RejectedInput",
    "RolloutGroup",
    "RoundReport",
    "SamplingParams",
    "SapoError",
    "SignedGroup",
    "Swarm",
    "TaskRef",
    "TrainingError",
    "TransportError",
    "TransportUnavailable",
    "WeightSyncError",
    "__version__",
]
