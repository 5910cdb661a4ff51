"""A live message, as a node sends it through a real nats-server, is spelled as the vectors.

docs/wire-vectors.json is what another implementation copies; an outside verifier found it
wrote ``tokenizer_id`` and ``config_digest`` without the ``0x`` every node writes. Here a
node of the tiny model generates and publishes a group on a real nats-server, plain nats-py
reads the raw message back, a schema-less msgpack decoder opens it, and its shape (keys in
order at every level, value kinds, digest spelling, message id header) is compared field by
field with the vectors'.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import nats
import pytest
from eth_hash.auto import keccak

from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.embedded import EmbeddedNats
from sapo_async.fabric.transport.jetstream import JetStreamTransport, NatsOptions
from sapo_async.fabric.transport.memory import MemoryBroker
from tests.fixtures.learning import peer_wire_groups, two_node_round_loop
from tests.unit.wire_vectors import PATH

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.slow]

SWARM = "live-wire"
DIGEST = re.compile(r"0x[0-9a-f]{64}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shape(value: Any) -> Any:
    """What a second implementation must reproduce of a decoded value: map keys in order,
    the kind of each value, and how digests and addresses are spelled."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["array", *sorted({repr(shape(v)) for v in value})]
    if isinstance(value, str):
        if DIGEST.fullmatch(value):
            return "digest"
        if re.fullmatch(r"0x[0-9a-fA-F]{40}", value):
            return "address"
        return "str"
    return type(value).__name__


async def test_a_live_message_is_spelled_as_the_vectors(nats_server: EmbeddedNats) -> None:
    vector = next(
        v
        for v in json.loads(PATH.read_text(encoding="utf-8"))["accepted"]
        if v["group"]["completions"][0]["token_ids"] is not None
    )
    node = await two_node_round_loop(SWARM, 0, MemoryBroker())
    group = (await peer_wire_groups(node))[0]
    transport = await JetStreamTransport.connect(NatsOptions(url=nats_server.url), SWARM)
    try:
        receipt = await Publisher(transport, node.spec.account).publish(group)
    finally:
        await transport.aclose()
    # From here on, only third-party code: nats-py, a schema-less msgpack decoder, keccak.
    client = await nats.connect(nats_server.url)
    try:
        raw = await client.jetstream().get_msg(receipt.ack.stream, receipt.ack.seq)
    finally:
        await client.close()
    body, signature = msgspec.msgpack.decode(raw.data)
    live = msgspec.msgpack.decode(body)
    assert len(signature) == 65
    assert (raw.headers or {})["Nats-Msg-Id"] == keccak(body).hex()
    assert vector["nats_msg_id"] == keccak(bytes.fromhex(vector["body_hex"])).hex()
    # Field by field: the same keys in the same order, each value of the same kind and
    # spelling (digests 0x + 64 lowercase hex on both sides).
    assert shape(live) == shape(vector["group"])
    assert DIGEST.fullmatch(live["tokenizer_id"])
    assert DIGEST.fullmatch(live["task"]["config_digest"])
    assert "0x" + keccak(live["task_config"].encode()).hex() == live["task"]["config_digest"]
