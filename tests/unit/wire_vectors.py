"""Builds docs/wire-vectors.json, the wire format's test vectors for other implementations.

Run ``python -m tests.unit.wire_vectors`` to rewrite the file after a deliberate change to
the wire format (which also changes SCHEMA_VERSION); ``tests/unit/test_wire_vectors.py``
fails while the file and the code disagree.

Each vector holds the group as JSON (field names and values as encoded), the body's hex,
the rollout hash, the EIP-191 digest that secp256k1 signs, the ``Nats-Msg-Id`` header a
publisher sends, the producer's test key, its address and the 65-byte signature. Digests
are spelled as in the body (``0x`` + 64 lowercase hex, ``HEX_DIGEST``); the message id
header alone is the bare 64 digits, as JetStream de-duplicates on it. The rejected vectors
carry the signature a verifier must refuse and the reason label this implementation counts
it under.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
from eth_account import Account

from sapo_async.fabric.transport.base import message_id
from sapo_async.tasks.spec import config_digest
from sapo_async.wire.rollout import (
    SCHEMA_VERSION,
    Completion,
    RolloutGroup,
    SamplingParams,
    TaskRef,
    encode_group,
    keccak256,
)
from sapo_async.wire.signing import SECP256K1_N, rollout_hash, sign_body, signing_digest

PATH = Path(__file__).resolve().parents[2] / "docs" / "wire-vectors.json"


def _key(i: int) -> bytes:
    # Public test keys: never hold value with them.
    return keccak256(f"sapo-wire-vector-key-{i}".encode())


def _groups() -> list[tuple[str, int, RolloutGroup]]:
    producer = [Account.from_key(_key(i)).address for i in range(2)]
    return [
        (
            "minimal: one completion, no token ids or log-probs (nil)",
            0,
            RolloutGroup(
                schema_version=SCHEMA_VERSION,
                swarm="demo",
                producer=producer[0],
                producer_round=0,
                policy_version=0,
                model_id="tiny",
                tokenizer_id="0x" + "0" * 64,
                task=TaskRef(
                    family="basic_arithmetic",
                    config_digest=config_digest('{"size":10}'),
                    seed=0,
                    index=0,
                ),
                task_config='{"size":10}',
                question="What is 2 + 2?",
                answer="4",
                completions=(Completion(text="<answer>4</answer>", finish_reason="stop"),),
                sampling=SamplingParams(),
                created_at_ms=1_767_225_600_000,
            ),
        ),
        (
            "tokens: two completions with token ids and log-probs, 64-bit seed and index",
            1,
            RolloutGroup(
                schema_version=SCHEMA_VERSION,
                swarm="paper-swarm_2",
                producer=producer[1],
                producer_round=1041,
                policy_version=1040,
                model_id="Qwen/Qwen2.5-0.5B-Instruct",
                tokenizer_id="0x" + "5f" * 32,
                task=TaskRef(
                    family="chain_sum",
                    config_digest=config_digest('{"max_terms":4}'),
                    seed=4095 << 52,
                    index=(1 << 50) | (3 << 30) | (1041 << 10) | 7,
                ),
                task_config='{"max_terms":4}',
                question="12 + 30 - 5 =",
                answer="37",
                completions=(
                    Completion(
                        text="<answer>37</answer>",
                        finish_reason="stop",
                        token_ids=(27, 9217, 29, 1806, 522, 9217, 29),
                        logprobs=(-0.25, -0.5, -0.0078125, -1.5, -0.125, -0.0625, -3.0),
                    ),
                    Completion(
                        text="<answer>3",
                        finish_reason="length",
                        token_ids=(27, 9217, 29, 18),
                        logprobs=(-0.25, -0.5, -0.0078125, -2.75),
                    ),
                ),
                sampling=SamplingParams(temperature=0.7, top_p=0.95, top_k=50, max_new_tokens=4),
                created_at_ms=1_767_225_661_234,
            ),
        ),
        (
            "unicode: non-ASCII text, a question longer than 31 bytes (str8)",
            0,
            RolloutGroup(
                schema_version=SCHEMA_VERSION,
                swarm="demo",
                producer=producer[0],
                producer_round=3,
                policy_version=2,
                model_id="tiny",
                tokenizer_id="0x" + "0" * 64,
                task=TaskRef(
                    family="basic_arithmetic",
                    config_digest=config_digest('{"size":10}'),
                    seed=1 << 52,
                    index=(3 << 10) | 1,
                ),
                task_config='{"size":10}',
                question="Combien font 6 × 7 ? Réponds entre balises ✓",
                answer="42",
                completions=(
                    Completion(text="<answer>42</answer> ✓", finish_reason="stop"),
                    Completion(text="", finish_reason="length"),
                ),
                sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=64),
                created_at_ms=1_767_225_700_000,
            ),
        ),
    ]


def _high_s_twin(signature: bytes) -> bytes:
    s = int.from_bytes(signature[32:64], "big")
    return signature[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - signature[64]])


def build_vectors() -> dict[str, Any]:
    """The vectors file's content (deterministic: RFC 6979 signatures, fixed keys)."""
    accepted: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for name, key_index, group in _groups():
        account = Account.from_key(_key(key_index))
        body = encode_group(group)
        signed = sign_body(account, body)
        digest = rollout_hash(body)
        accepted.append(
            {
                "name": name,
                "group": msgspec.to_builtins(group),
                "body_hex": body.hex(),
                "rollout_hash": "0x" + digest.hex(),
                "signing_digest": "0x" + signing_digest(digest).hex(),
                "nats_msg_id": message_id(signed),
                "private_key": _key(key_index).hex(),
                "address": account.address,
                "signature": signed.signature.hex(),
            }
        )
    first = accepted[0]
    signature = bytes.fromhex(first["signature"])
    rejected.append(
        {
            "name": "high-s twin of the first vector's signature (s' = n - s, v flipped)",
            "body_hex": first["body_hex"],
            "signature": _high_s_twin(signature).hex(),
            "reason": "high_s_signature",
        }
    )
    other = Account.from_key(_key(1))
    rejected.append(
        {
            "name": "first vector's body signed by another key than its producer",
            "body_hex": first["body_hex"],
            "signature": sign_body(other, bytes.fromhex(first["body_hex"])).signature.hex(),
            "reason": "signer_mismatch",
        }
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "about": "Test vectors of the sapo_async rollout wire format; see docs/fabric.md, "
        "'Wire format'. Keys are public test keys.",
        "accepted": accepted,
        "rejected": rejected,
    }


def render() -> str:
    """The file's text."""
    return json.dumps(build_vectors(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    PATH.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {PATH}\n")
