"""Wire types shared by every port: the rollout group and its canonical encoding."""

from sapo_async.wire.rollout import (
    SCHEMA_VERSION,
    Completion,
    RolloutGroup,
    SamplingParams,
    SignedGroup,
    TaskRef,
    content_hash,
    decode_group,
    encode_group,
    keccak256,
)

__all__ = [
    "SCHEMA_VERSION",
    "Completion",
    "RolloutGroup",
    "SamplingParams",
    "SignedGroup",
    "TaskRef",
    "content_hash",
    "decode_group",
    "encode_group",
    "keccak256",
]
