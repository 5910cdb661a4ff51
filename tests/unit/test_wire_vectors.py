"""docs/wire-vectors.json: what another implementation checks itself against.

Each accepted vector is checked twice: against this implementation (encode, hash, sign,
verify) and against independent tools (a schema-less msgpack decoder, raw keccak and
eth-account's recovery), so the file says what the format is, not only what the code does.
"""

from __future__ import annotations

import json
import re

import msgspec
import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_hash.auto import keccak

from sapo_async.errors import RejectedInput
from sapo_async.wire.rollout import SCHEMA_VERSION, RolloutGroup, SignedGroup, encode_group
from sapo_async.wire.signing import EIP191_PREFIX, decode_body, sign_body, verify
from tests.unit.wire_vectors import PATH, render

VECTORS = json.loads(PATH.read_text(encoding="utf-8"))
DIGEST = re.compile(r"0x[0-9a-f]{64}")


def test_vector_file_is_what_the_code_produces_today() -> None:
    assert PATH.read_text(encoding="utf-8") == render(), (
        "docs/wire-vectors.json is out of date: run python -m tests.unit.wire_vectors"
    )
    assert VECTORS["schema_version"] == SCHEMA_VERSION
    assert len(VECTORS["accepted"]) >= 3
    assert {v["reason"] for v in VECTORS["rejected"]} == {"high_s_signature", "signer_mismatch"}


@pytest.mark.parametrize("vector", VECTORS["accepted"], ids=lambda v: v["name"].split(":")[0])
def test_accepted_vector_checks_out_with_independent_tools(vector: dict) -> None:  # type: ignore[type-arg]
    body = bytes.fromhex(vector["body_hex"])
    # The body is a plain msgpack map whose keys come in declaration order.
    plain = msgspec.msgpack.decode(body)
    assert plain == vector["group"]
    assert list(plain) == list(RolloutGroup.__struct_fields__)
    assert "0x" + keccak(body).hex() == vector["rollout_hash"]
    assert keccak(body).hex() == vector["nats_msg_id"]
    digest = keccak(EIP191_PREFIX + keccak(body))
    assert "0x" + digest.hex() == vector["signing_digest"]
    # Every digest is spelled one way: 0x + 64 lowercase hex (as nodes write them).
    for value in (
        plain["tokenizer_id"],
        plain["task"]["config_digest"],
        vector["rollout_hash"],
        vector["signing_digest"],
    ):
        assert DIGEST.fullmatch(value), value
    account = Account.from_key(vector["private_key"])
    assert account.address == vector["address"] == plain["producer"]
    recovered = Account.recover_message(
        encode_defunct(primitive=keccak(body)),
        signature=bytes.fromhex(vector["signature"]),
    )
    assert recovered == vector["address"]


@pytest.mark.parametrize("vector", VECTORS["accepted"], ids=lambda v: v["name"].split(":")[0])
def test_accepted_vector_round_trips_through_this_implementation(vector: dict) -> None:  # type: ignore[type-arg]
    body = bytes.fromhex(vector["body_hex"])
    group = msgspec.convert(vector["group"], RolloutGroup)
    assert encode_group(group) == body
    signed = sign_body(Account.from_key(vector["private_key"]), body)
    assert signed.signature.hex() == vector["signature"]  # RFC 6979: deterministic
    checked = verify(signed)
    assert checked.signer == vector["address"]
    assert "0x" + checked.rollout_hash.hex() == vector["rollout_hash"]


@pytest.mark.parametrize("field", ["tokenizer_id", "config_digest"])
def test_a_digest_spelled_without_0x_is_malformed(field: str) -> None:
    vector = VECTORS["accepted"][0]
    plain = msgspec.msgpack.decode(bytes.fromhex(vector["body_hex"]))
    holder = plain["task"] if field == "config_digest" else plain
    holder[field] = holder[field].removeprefix("0x")
    with pytest.raises(RejectedInput) as caught:
        decode_body(msgspec.msgpack.encode(plain))
    assert caught.value.reason == "malformed_group"


@pytest.mark.parametrize("vector", VECTORS["rejected"], ids=lambda v: v["reason"])
def test_rejected_vector_is_refused_for_its_reason(vector: dict) -> None:  # type: ignore[type-arg]
    signed = SignedGroup(
        body=bytes.fromhex(vector["body_hex"]), signature=bytes.fromhex(vector["signature"])
    )
    with pytest.raises(RejectedInput) as caught:
        verify(signed)
    assert caught.value.reason == vector["reason"]
