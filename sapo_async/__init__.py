"""sapo_async: decentralised RL post-training with collective experience sharing (SAPO).

The public API is what ``__all__`` lists; everything else is implementation.
"""

from __future__ import annotations

from sapo_async.audit import audit_node, audit_swarm, verify_rollout
from sapo_async.collector import Collector
from sapo_async.config import NodeConfig, load_config
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
from sapo_async.hardware import select_backend
from sapo_async.journal import Journal
from sapo_async.ledger import RoundCommitment
from sapo_async.node import Node, RoundReport
from sapo_async.publisher import Publisher
from sapo_async.recorder import Recorder
from sapo_async.swarm import Swarm, build_learner
from sapo_async.transport import EmbeddedNats, MemoryBroker, NatsOptions, StartAt
from sapo_async.wire import Completion, RolloutGroup, SamplingParams, SignedGroup, TaskRef
from sapo_async.wire.signing import sign_group
from sapo_async.wire.signing import verify as verify_signed

__version__ = "0.1.0"

__all__ = [
    "ActorError",
    "ActorFailed",
    "ActorStopped",
    "CheckpointError",
    "Collector",
    "CommitmentRejected",
    "Completion",
    "ConfigError",
    "EmbeddedNats",
    "GenerationError",
    "Journal",
    "LedgerError",
    "LedgerUnavailable",
    "MemoryBroker",
    "NatsOptions",
    "Node",
    "NodeConfig",
    "PublishError",
    "Publisher",
    "Recorder",
    "RejectedInput",
    "RolloutGroup",
    "RoundCommitment",
    "RoundReport",
    "SamplingParams",
    "SapoError",
    "SignedGroup",
    "StartAt",
    "Swarm",
    "TaskRef",
    "TrainingError",
    "TransportError",
    "TransportUnavailable",
    "WeightSyncError",
    "__version__",
    "audit_node",
    "audit_swarm",
    "build_learner",
    "load_config",
    "select_backend",
    "sign_group",
    "verify_rollout",
    "verify_signed",
]
