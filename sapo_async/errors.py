"""The one exception tree of sapo_async.

Every error the library raises on purpose derives from :class:`SapoError`. Foreign
exceptions (nats, web3, vLLM, torch) are translated into this tree at the adapter that
meets them, with ``raise ... from exc``, and nowhere else. Where a builtin fits, an error
inherits it too, so ``except ValueError`` keeps working for callers who do not know us::

    SapoError
    ├── ConfigError (ValueError)            bad settings, named by field
    │   └── IdentityError                   the node's keystore cannot be created or opened
    ├── RejectedInput (ValueError)          a message or value from outside failed a check
    ├── ActorError
    │   ├── ActorStopped (RuntimeError)     asked something of a stopped actor
    │   └── ActorFailed                     an actor's body raised; carries the actor name
    ├── TransportError
    │   ├── TransportUnavailable (ConnectionError)
    │   └── PublishError                    the server did not acknowledge a publish
    │       └── PublishRefused              ... and never will (too large): do not retry
    │           └── StreamMissing           the swarm's stream is gone and cannot be recreated
    ├── LedgerError
    │   ├── LedgerUnavailable (ConnectionError)
    │   ├── CommitmentRejected              the chain reverted a commitment (carries tx hash)
    │   └── JournalError                    the local journal cannot be opened, read or written
    ├── GenerationError
    │   └── WeightSyncError                 engine weights disagree with the trainer's
    └── TrainingError
        └── CheckpointError                 a checkpoint is missing, torn or incompatible

Errors carry typed data (rollout hash, producer, tx hash) as attributes so callers and
counters never parse messages.
"""

from __future__ import annotations

__all__ = [
    "ActorError",
    "ActorFailed",
    "ActorStopped",
    "CheckpointError",
    "CommitmentRejected",
    "ConfigError",
    "GenerationError",
    "IdentityError",
    "JournalError",
    "LedgerError",
    "LedgerUnavailable",
    "PublishError",
    "PublishRefused",
    "RejectedInput",
    "SapoError",
    "StreamMissing",
    "TrainingError",
    "TransportError",
    "TransportUnavailable",
    "WeightSyncError",
]


class SapoError(Exception):
    """Root of every error sapo_async raises on purpose."""


class ConfigError(SapoError, ValueError):
    """A setting is missing or has a value outside what is allowed.

    Attributes:
        field: dotted name of the offending setting, if known.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class IdentityError(ConfigError):
    """The node's keystore cannot be created or opened (no password, wrong password, bad
    file); the message says what to do."""


class RejectedInput(SapoError, ValueError):
    """Input from outside (a peer's message, a user's value) failed a check.

    Attributes:
        reason: a short machine-readable reason, used as a counter label.
        rollout_hash: hex keccak-256 of the offending rollout, when one was computed.
        producer: claimed producer address, when one could be read.
    """

    def __init__(
        self,
        reason: str,
        detail: str = "",
        *,
        rollout_hash: str | None = None,
        producer: str | None = None,
    ) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.rollout_hash = rollout_hash
        self.producer = producer


class ActorError(SapoError):
    """Something went wrong in the actor runtime."""


class ActorStopped(ActorError, RuntimeError):
    """An actor was asked for work after it stopped (or while draining)."""

    def __init__(self, actor: str, state: str) -> None:
        super().__init__(f"actor {actor!r} is {state}")
        self.actor = actor
        self.state = state


class ActorFailed(ActorError):
    """An actor's body raised; the original error is ``__cause__``."""

    def __init__(self, actor: str, message: str = "") -> None:
        super().__init__(f"actor {actor!r} failed" + (f": {message}" if message else ""))
        self.actor = actor


class TransportError(SapoError):
    """The rollout transport (NATS or in-memory) failed."""


class TransportUnavailable(TransportError, ConnectionError):
    """The transport's server cannot be reached (yet)."""


class PublishError(TransportError):
    """A publish was not acknowledged.

    Attributes:
        rollout_hash: hex hash of the group that was not acknowledged.
    """

    def __init__(self, message: str, *, rollout_hash: str | None = None) -> None:
        super().__init__(message)
        self.rollout_hash = rollout_hash


class PublishRefused(PublishError):
    """The server refused a message for good (too large, no such stream): do not retry."""


class StreamMissing(PublishRefused):
    """The swarm's stream was deleted and this credential may not recreate it: publishes
    fail at once (no retries) until the stream is back; the node trains on its own groups."""


class LedgerError(SapoError):
    """The EVM ledger failed."""


class LedgerUnavailable(LedgerError, ConnectionError):
    """The chain's RPC endpoint cannot be reached (yet)."""


class CommitmentRejected(LedgerError):
    """The chain reverted a commitment.

    Attributes:
        tx_hash: hex transaction hash, if the transaction was mined.
        reason: the decoded revert reason or custom error name, if known.
    """

    def __init__(
        self, message: str, *, tx_hash: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.tx_hash = tx_hash
        self.reason = reason


class JournalError(LedgerError):
    """The node's local journal (SQLite) cannot be opened, read or written.

    Attributes:
        path: the journal file.
        cause: why: ``locked`` (another process holds its write lock: wait and retry),
            ``full`` (its disk is full), ``read_only`` (file, folder or filesystem),
            ``io`` (the disk failed a read or write) or ``damaged`` (not SQLite, or
            malformed: never retried, never rewritten).
    """

    def __init__(self, message: str, *, path: str | None = None, cause: str = "damaged") -> None:
        super().__init__(message)
        self.path = path
        self.cause = cause

    @property
    def locked(self) -> bool:
        """Another process holds the journal's write lock (the one cause worth waiting out)."""
        return self.cause == "locked"


class GenerationError(SapoError):
    """A generation backend failed."""


class WeightSyncError(GenerationError):
    """After a weight sync, the engine's log-probs disagree with the trainer's.

    Attributes:
        mismatch: the measured mean absolute log-prob difference.
        threshold: the allowed maximum.
    """

    def __init__(self, mismatch: float, threshold: float) -> None:
        super().__init__(
            f"engine and trainer log-probs differ by {mismatch:.4g} (allowed {threshold:.4g})"
        )
        self.mismatch = mismatch
        self.threshold = threshold


class TrainingError(SapoError):
    """The trainer failed."""


class CheckpointError(TrainingError):
    """A checkpoint is missing, torn, or does not match the model or optimizer."""
