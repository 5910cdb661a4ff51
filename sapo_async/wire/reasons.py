"""The one set of labels for why an external rollout group was refused.

Owns :class:`RejectReason`. Floor 1 (wire), so the fabric, the node, ops (metrics, status)
and the docs test all read the same enum. The labels are strings (a ``StrEnum``): a
:class:`~sapo_async.errors.RejectedInput` carries one as its ``reason``, counters key on
it, and docs/security.md lists exactly these values (a test checks).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AFTER_ADMISSION", "RejectReason"]


class RejectReason(StrEnum):
    """Why an external rollout group was refused: the one set of labels that the collector's
    statistics, the round's ``rejections``, Prometheus' ``sapo_rejections{reason=...}``, the
    status table, the log lines and docs/security.md all use. Each has one meaning.

    Admission (the collector, :mod:`sapo_async.fabric.admission`; docs/admission.md gives
    the order) refuses a message before it is buffered; after admission the round
    (:mod:`sapo_async.node.selection`) drops a buffered group it will not train on.
    """

    # decoding (wire)
    OVERSIZE = "oversize"
    MALFORMED_ENVELOPE = "malformed_envelope"
    SCHEMA_VERSION = "schema_version"
    MALFORMED_GROUP = "malformed_group"
    # before the signature
    WRONG_SWARM = "wrong_swarm"
    INVALID_GROUP = "invalid_group"
    WRONG_SUBJECT = "wrong_subject"
    WRONG_SHARD = "wrong_shard"
    HASH_MISMATCH = "hash_mismatch"
    ALREADY_TRAINED = "already_trained"
    DUPLICATE = "duplicate"
    QUARANTINED = "quarantined"
    TASK_OUTSIDE_PRESET = "task_outside_preset"
    PROMPT_TOO_LONG = "prompt_too_long"
    COMPLETION_TOO_LONG = "completion_too_long"
    """A completion's text is longer than ``defence.max_completion_chars`` characters."""
    PRODUCER_ROUND_FLOOD = "producer_round_flood"
    # the signature
    BAD_SIGNATURE = "bad_signature"
    HIGH_S_SIGNATURE = "high_s_signature"
    SIGNER_MISMATCH = "signer_mismatch"
    # after the signature
    FROM_FUTURE = "from_future"
    STALE_AGE = "stale_age"
    STALE_ROUND = "stale_round"
    CHECK_ERROR = "check_error"
    INTERNAL_ERROR = "internal_error"
    # after admission, in the round (drops)
    TASK_CONFIG_DIGEST = "task_config_digest"
    TASK_FAMILY = "task_family"
    TASK_DERIVATION = "task_derivation"
    TASK_MISMATCH = "task_mismatch"
    SCORE_ERROR = "score_error"
    COMPLETION_TOO_MANY_TOKENS = "completion_too_many_tokens"
    """A completion re-tokenised by the receiver has more tokens than its own
    ``max_new_tokens`` (plus EOS)."""
    TOKEN_MISMATCH = "token_mismatch"  # noqa: S105 - a label, not a secret
    IMPLAUSIBLE = "implausible"
    TOO_LONG = "too_long"
    """A rewarded completion is longer than the length guard allows for its family."""
    TOO_BRIEF = "too_brief"
    """A rewarded completion shows far less text before its answer than the node's own do."""
    REPETITIVE = "repetitive"
    """A rewarded completion repeats a short token pattern over ``repetition_limit`` tokens."""
    RATIO_EXTREME = "ratio_extreme"


AFTER_ADMISSION: tuple[RejectReason, ...] = (
    RejectReason.TASK_CONFIG_DIGEST,
    RejectReason.TASK_FAMILY,
    RejectReason.TASK_DERIVATION,
    RejectReason.TASK_MISMATCH,
    RejectReason.SCORE_ERROR,
    RejectReason.COMPLETION_TOO_MANY_TOKENS,
    RejectReason.TOKEN_MISMATCH,
    RejectReason.IMPLAUSIBLE,
    RejectReason.TOO_LONG,
    RejectReason.TOO_BRIEF,
    RejectReason.REPETITIVE,
    RejectReason.RATIO_EXTREME,
)
"""The checks the round runs on groups the collector admitted (drops), in the order the
enum lists them: what an honest swarm's closing table and the attack matrix's no-attack
runs report false-positive rates for, every one of them, zeros included."""
