"""The rollout group: one question and its L completions, as shared between nodes.

Owns the shape of what nodes exchange and its one canonical encoding. The same bytes are
sent on the wire and hashed (keccak-256) for signing and for ledger commitments, so a
group is never re-encoded between hashing and sending.

Deliberately does not know about NATS, keys or models. Rewards are never part of a group:
every receiver re-derives the task from :class:`TaskRef` and scores with its own verifier.

Invariants:
    * encoding is deterministic: msgpack of frozen structs, fields in declaration order,
      no maps with caller-chosen key order;
    * ``decode_group(encode_group(g)) == g`` for every valid group;
    * decoding is strict: unknown fields, wrong types and a wrong schema version are errors;
    * a digest in the body (``tokenizer_id``, ``task.config_digest``) has one spelling,
      :data:`HEX_DIGEST`: ``0x`` and 64 lowercase hex digits, as Ethereum tools print a
      ``bytes32``; any other spelling fails decoding (a second implementation that wrote
      them bare would otherwise have every group dropped as outside the preset).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from eth_hash.auto import keccak as _keccak

__all__ = [
    "HEX_DIGEST",
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

SCHEMA_VERSION = 1
"""Bumped on any change to the encoded shape; receivers reject other versions."""

HEX_DIGEST = r"^0x[0-9a-f]{64}$"
"""The one spelling of a 32-byte digest in a body: ``0x`` + 64 lowercase hex digits."""

Digest = Annotated[str, msgspec.Meta(pattern=HEX_DIGEST)]


class TaskRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a question comes from, so that anyone can re-derive it.

    Attributes:
        family: reasoning-gym dataset name, e.g. ``"basic_arithmetic"``.
        config_digest: keccak-256 of the canonical JSON of the dataset config, spelled
            :data:`HEX_DIGEST`.
        seed: dataset seed.
        index: item index within the dataset.
    """

    family: str
    config_digest: Digest
    seed: int
    index: int


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How completions were sampled.

    Attributes:
        temperature: softmax temperature (> 0).
        top_p: nucleus mass in (0, 1]; 1.0 disables it.
        top_k: keep the k most likely tokens; 0 disables it (transformers defaults to 50,
            which distorts sampling on tiny vocabularies, so we always pass it explicitly).
        max_new_tokens: cap on generated tokens per completion.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64


class Completion(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One sampled completion.

    Attributes:
        text: decoded completion text (what receivers train on).
        finish_reason: ``"stop"`` (end of sequence) or ``"length"`` (hit max_new_tokens).
        token_ids: sampled token ids, meaningful only under the producer's tokenizer.
        logprobs: per-token log-probabilities of the sampled tokens under the generating
            policy, same length as ``token_ids``.
    """

    text: str
    finish_reason: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None


class RolloutGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One question group, the unit of sharing.

    Attributes:
        schema_version: :data:`SCHEMA_VERSION` at encoding time.
        swarm: swarm id; receivers reject other swarms.
        producer: checksummed Ethereum address of the producing node.
        producer_round: the producer's own round counter when it generated the group.
        policy_version: optimizer steps the generating policy had taken.
        model_id: producer's model name (informational).
        tokenizer_id: digest of the producer's tokenizer, spelled :data:`HEX_DIGEST`; token
            ids and log-probs are only used by receivers whose tokenizer digest is equal.
        task: reference from which the question and answer are re-derived.
        task_config: canonical JSON of the dataset config (its keccak is
            ``task.config_digest``).
        question: the question text as prompted.
        answer: the ground-truth answer the producer derived (checked, never trusted).
        completions: the L completions.
        sampling: sampling parameters used.
        created_at_ms: unix time in milliseconds at generation.
    """

    schema_version: int
    swarm: str
    producer: str
    producer_round: int
    policy_version: int
    model_id: str
    tokenizer_id: Digest
    task: TaskRef
    task_config: str
    question: str
    answer: str
    completions: tuple[Completion, ...]
    sampling: SamplingParams
    created_at_ms: int


class SignedGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """The wire envelope: the exact encoded group bytes and the producer's signature.

    Attributes:
        body: ``encode_group(group)``; its keccak-256 is the rollout hash.
        signature: 65-byte secp256k1 signature (r, s, v) of the rollout hash; the scheme is
            documented in docs/fabric.md.
    """

    body: bytes
    signature: bytes


_encoder = msgspec.msgpack.Encoder()
_group_decoder = msgspec.msgpack.Decoder(RolloutGroup)


def encode_group(group: RolloutGroup) -> bytes:
    """Return the canonical bytes of ``group`` (used on the wire and for hashing)."""
    return _encoder.encode(group)


def decode_group(body: bytes) -> RolloutGroup:
    """Decode canonical bytes strictly.

    Raises:
        msgspec.ValidationError, msgspec.DecodeError: malformed input (callers at the
            edge translate these into :class:`~sapo_async.errors.RejectedInput`).
    """
    return _group_decoder.decode(body)


def keccak256(data: bytes) -> bytes:
    """Ethereum's keccak-256 of ``data`` (32 bytes)."""
    return bytes(_keccak(data))


_content_encoder = msgspec.msgpack.Encoder()


def content_hash(group: RolloutGroup) -> bytes:
    """keccak-256 of what a receiver trains on in ``group``: its swarm, task, question and
    completion texts, not who signed it, when, in which round or with which token ids
    and log-probs. Two groups with equal content hashes are one experience however many
    keys send it (the collector admits it once: :mod:`sapo_async.fabric.collector`)."""
    fields = (
        group.swarm,
        group.task,
        group.question,
        [c.text for c in group.completions],
    )
    return keccak256(b"sapo-content:" + _content_encoder.encode(fields))
