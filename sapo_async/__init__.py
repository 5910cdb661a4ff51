"""sapo_async: decentralised RL post-training with collective experience sharing (SAPO).

The public API is what ``__all__`` lists; everything else is implementation. Names load
lazily (:mod:`sapo_async._lazy`): ``import sapo_async`` costs almost nothing, and
``sapo_async.Swarm`` imports the node, torch and the rest on first use.

The package is laid out by stage, in floors; a module imports only from its own floor or
below, never up, and the ports never import each other:

0. foundation: :mod:`.errors` (the one exception tree), :mod:`.limits` (every default
   timeout and cap, each with its reason), :mod:`.logs`, :mod:`.backoff` (the one retry
   schedule), :mod:`.actors` (the life cycle every long-running piece uses),
   :mod:`.pulse` (the one "something changed, look again" wake-up),
   :mod:`.process` (the one child-process base: nats-server, anvil),
   :mod:`.lockfile` (one node per data directory and per key: OS file locks).
1. :mod:`.wire`: the rollout group, its canonical encoding, hash and signature.
2. :mod:`.tasks`: reasoning-gym families, task references, prompts, the verifier.
3. the three ports and what runs on them, side by side:
   :mod:`.fabric` (transport, publisher, collector: rollouts in and out),
   :mod:`.ledger` (chain, journal, recorder, audit: commitments and credit),
   :mod:`.policy` (models, generation, GRPO: the learning itself).
4. :mod:`.node`: one node (spec, learner, sampler, round loop, life cycle, checkpoint) and
   :mod:`.node.swarm`, which assembles a node from a :class:`NodeSpec`.
5. :mod:`.ops`: what a volunteer's machine needs around a node (config files, identity,
   doctor, devnet, hardware choice, metrics, status).
6. :mod:`.experiment`, :mod:`.explorer` and :mod:`.cli`: entry points (the explorer is
   a web app over the ledger and the logs).

A round flows task -> generate (policy) -> publish (fabric) -> collect (fabric) ->
sample (node) -> train (policy) -> commit (ledger). docs/layout.md draws the map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sapo_async._lazy import lazy_exports
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

if TYPE_CHECKING:
    from sapo_async.fabric.collector import Collector
    from sapo_async.fabric.publisher import Publisher
    from sapo_async.fabric.transport import EmbeddedNats, MemoryBroker, NatsOptions, StartAt
    from sapo_async.ledger.audit import audit_node, audit_swarm, ledger_scores, verify_rollout
    from sapo_async.ledger.journal import Journal
    from sapo_async.ledger.recorder import Recorder
    from sapo_async.ledger.types import RoundCommitment
    from sapo_async.node.learner import build_learner
    from sapo_async.node.lifecycle import Node
    from sapo_async.node.report import RoundReport
    from sapo_async.node.spec import NodeSpec
    from sapo_async.node.swarm import Swarm
    from sapo_async.ops.config import NodeConfig, load_config
    from sapo_async.ops.hardware import select_backend
    from sapo_async.wire import Completion, RolloutGroup, SamplingParams, SignedGroup, TaskRef
    from sapo_async.wire.signing import sign_group
    from sapo_async.wire.signing import verify as verify_signed

__version__ = "0.1.0"

_LAZY = {
    "Collector": "sapo_async.fabric.collector",
    "Completion": "sapo_async.wire",
    "EmbeddedNats": "sapo_async.fabric.transport",
    "Journal": "sapo_async.ledger.journal",
    "MemoryBroker": "sapo_async.fabric.transport",
    "NatsOptions": "sapo_async.fabric.transport",
    "Node": "sapo_async.node.lifecycle",
    "NodeConfig": "sapo_async.ops.config",
    "NodeSpec": "sapo_async.node.spec",
    "Publisher": "sapo_async.fabric.publisher",
    "Recorder": "sapo_async.ledger.recorder",
    "RolloutGroup": "sapo_async.wire",
    "RoundCommitment": "sapo_async.ledger.types",
    "RoundReport": "sapo_async.node.report",
    "SamplingParams": "sapo_async.wire",
    "SignedGroup": "sapo_async.wire",
    "StartAt": "sapo_async.fabric.transport",
    "Swarm": "sapo_async.node.swarm",
    "TaskRef": "sapo_async.wire",
    "audit_node": "sapo_async.ledger.audit",
    "audit_swarm": "sapo_async.ledger.audit",
    "build_learner": "sapo_async.node.learner",
    "ledger_scores": "sapo_async.ledger.audit",
    "load_config": "sapo_async.ops.config",
    "select_backend": "sapo_async.ops.hardware",
    "sign_group": "sapo_async.wire.signing",
    "verify_rollout": "sapo_async.ledger.audit",
    "verify_signed": "sapo_async.wire.signing:verify",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

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
    "NodeSpec",
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
    "ledger_scores",
    "load_config",
    "select_backend",
    "sign_group",
    "verify_rollout",
    "verify_signed",
]
