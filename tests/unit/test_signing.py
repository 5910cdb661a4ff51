"""Canonical encoding, rollout hash and the EIP-191 signature scheme."""

from __future__ import annotations

import msgspec
import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_defunct
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo_async.errors import RejectedInput
from sapo_async.wire.rollout import (
    SCHEMA_VERSION,
    Completion,
    RolloutGroup,
    SamplingParams,
    SignedGroup,
    TaskRef,
    decode_group,
    encode_group,
    keccak256,
)
from sapo_async.wire.signing import (
    EIP191_PREFIX,
    SECP256K1_N,
    decode_envelope,
    decode_signed,
    encode_signed,
    recover_signer,
    reference_recover,
    rollout_hash,
    sign_body,
    sign_group,
    signing_digest,
    verify,
)
from tests.fixtures.fabric import make_account, make_group

ACCOUNT = make_account(0)
OTHER = make_account(1)

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
digests = st.binary(min_size=32, max_size=32).map(lambda b: "0x" + b.hex())
floats = st.floats(allow_nan=False)
completions = st.builds(
    Completion,
    text=texts,
    finish_reason=st.sampled_from(["stop", "length"]),
    token_ids=st.none() | st.lists(st.integers(0, 2**31), max_size=8).map(tuple),
    logprobs=st.none() | st.lists(st.floats(max_value=0, allow_nan=False), max_size=8).map(tuple),
)
groups = st.builds(
    RolloutGroup,
    schema_version=st.just(SCHEMA_VERSION),
    swarm=texts,
    producer=st.just(ACCOUNT.address),
    producer_round=ints,
    policy_version=ints,
    model_id=texts,
    tokenizer_id=digests,
    task=st.builds(TaskRef, family=texts, config_digest=digests, seed=ints, index=ints),
    task_config=texts,
    question=texts,
    answer=texts,
    completions=st.lists(completions, max_size=4).map(tuple),
    sampling=st.builds(
        SamplingParams, temperature=floats, top_p=floats, top_k=ints, max_new_tokens=ints
    ),
    created_at_ms=ints,
)


@given(groups)
@settings(max_examples=200, deadline=None)
def test_encoding_round_trips_and_the_hash_is_stable(group: RolloutGroup) -> None:
    body = encode_group(group)
    assert decode_group(body) == group
    assert encode_group(decode_group(body)) == body
    assert rollout_hash(body) == keccak256(encode_group(group))
    assert len(rollout_hash(body)) == 32


@given(groups)
@settings(max_examples=25, deadline=None)
def test_signed_group_verifies_to_its_producer(group: RolloutGroup) -> None:
    signed = sign_group(ACCOUNT, group)
    decoded, digest, signer = verify(decode_signed(encode_signed(signed), max_bytes=1 << 20))
    assert decoded == group
    assert digest == rollout_hash(signed.body)
    assert signer == ACCOUNT.address


def test_hash_of_a_known_group_never_changes() -> None:
    # Pinned: a change here means every stored hash and on-chain commitment breaks.
    group = make_group(ACCOUNT, created_at_ms=1_700_000_000_000, text="The answer is 4.")
    assert rollout_hash(encode_group(group)).hex() == PINNED_HASH


# The test group's digests gained their 0x (the one spelling nodes always wrote): a new
# test group, not a format change (the vectors pin the format itself).
PINNED_HASH = "19dd4e1c94f7f3519a6ef5e0339b3266b93488fee1bf3c2bfee72f8f88d2f511"


def test_signature_is_eip191_over_the_rollout_hash_and_recovers_with_eth_account() -> None:
    group = make_group(ACCOUNT)
    signed = sign_group(ACCOUNT, group)
    digest = rollout_hash(signed.body)
    # The exact 32 bytes that secp256k1 signs, as documented in docs/fabric.md.
    assert signing_digest(digest) == keccak256(EIP191_PREFIX + digest)
    assert signing_digest(digest) == _hash_eip191_message(encode_defunct(primitive=digest))
    assert Account.recover_message(
        encode_defunct(primitive=digest), signature=signed.signature
    ) == (ACCOUNT.address)
    assert recover_signer(digest, signed.signature) == reference_recover(digest, signed.signature)


def test_signing_a_group_of_another_producer_is_refused() -> None:
    with pytest.raises(ValueError, match="not the signing account"):
        sign_group(OTHER, make_group(ACCOUNT))


def test_group_signed_by_another_key_is_rejected_as_signer_mismatch() -> None:
    forged = sign_body(OTHER, encode_group(make_group(ACCOUNT)))
    with pytest.raises(RejectedInput) as caught:
        verify(forged)
    assert caught.value.reason == "signer_mismatch"


def test_text_altered_after_signing_is_rejected() -> None:
    signed = sign_group(ACCOUNT, make_group(ACCOUNT, text="honest"))
    altered = SignedGroup(
        body=signed.body.replace(b"honest", b"2+2=5!"), signature=signed.signature
    )
    with pytest.raises(RejectedInput) as caught:
        verify(altered)
    assert caught.value.reason in {"signer_mismatch", "bad_signature"}


@pytest.mark.parametrize(
    ("signature", "reason"),
    [
        (b"", "bad_signature"),
        (b"\x00" * 65, "bad_signature"),
        (b"\x01" * 64 + b"\x05", "bad_signature"),
    ],
)
def test_malformed_signatures_are_rejected_by_name(signature: bytes, reason: str) -> None:
    signed = SignedGroup(body=encode_group(make_group(ACCOUNT)), signature=signature)
    with pytest.raises(RejectedInput) as caught:
        verify(signed)
    assert caught.value.reason == reason


def test_wrong_schema_version_is_named_before_strict_decoding() -> None:
    body = msgspec.msgpack.encode({"schema_version": 99, "future_field": 1})
    with pytest.raises(RejectedInput) as caught:
        verify(SignedGroup(body=body, signature=b"\x00" * 65))
    assert caught.value.reason == "schema_version"


def test_oversize_envelope_is_rejected_before_decoding() -> None:
    with pytest.raises(RejectedInput) as caught:
        decode_signed(b"\x00" * 2000, max_bytes=1000)
    assert caught.value.reason == "oversize"


def test_fast_signature_is_byte_identical_to_eth_accounts() -> None:
    body = encode_group(make_group(ACCOUNT))
    ours = sign_body(ACCOUNT, body).signature
    theirs = ACCOUNT.sign_message(encode_defunct(primitive=rollout_hash(body))).signature
    assert ours == bytes(theirs)


def test_decoding_an_envelope_twice_gives_the_same_verdict_and_failures_are_not_cached() -> None:
    data = encode_signed(sign_group(ACCOUNT, make_group(ACCOUNT)))
    first, second = decode_envelope(data), decode_envelope(bytes(bytearray(data)))
    assert first == second
    assert first.rollout_hash == rollout_hash(first.signed.body)
    for _ in range(2):
        with pytest.raises(RejectedInput) as caught:
            decode_envelope(data[:-1])
        assert caught.value.reason == "malformed_envelope"


def high_s_twin(signature: bytes) -> bytes:
    """The malleable twin (r, n - s, v ^ 1) of a signature: valid secp256k1, high s."""
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    return signature[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])


def test_high_s_twin_of_a_valid_signature_is_rejected_as_openzeppelin_does() -> None:
    # eth-account recovers the producer from the twin; OpenZeppelin's ECDSA.recover reverts
    # (ECDSAInvalidSignatureS). The fabric's check is documented to equal OpenZeppelin's.
    signed = sign_group(ACCOUNT, make_group(ACCOUNT))
    twin = high_s_twin(signed.signature)
    digest = rollout_hash(signed.body)
    assert reference_recover(digest, twin) == ACCOUNT.address  # a real signature, not noise
    with pytest.raises(RejectedInput) as caught:
        verify(SignedGroup(body=signed.body, signature=twin))
    assert caught.value.reason == "high_s_signature"
    assert verify(signed).signer == ACCOUNT.address
