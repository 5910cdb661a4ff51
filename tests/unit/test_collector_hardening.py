"""The collector under a flood: trained hashes stay refused, the buffer belongs to the loop,
dropped groups are gone for good, quarantined producers are refused before any work."""

from __future__ import annotations

import threading
import time

import pytest

from sapo_async.fabric import collector as collector_module
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.admission import QuarantineCheck
from sapo_async.node.quarantine import Quarantine
from sapo_async.wire import signing
from sapo_async.wire.rollout import RolloutGroup
from sapo_async.wire.signing import encode_signed, sign_group
from tests.fixtures.fabric import SWARM, make_account, make_group

ME = make_account(0)
PEER = make_account(1)
FLOODER = make_account(3)


def new_collector(**kw: object) -> Collector:
    return Collector(MemoryBroker().connect(SWARM), own_address=ME.address, **kw)  # type: ignore[arg-type]


def wire(group: RolloutGroup, account=PEER) -> bytes:  # type: ignore[no-untyped-def]
    return encode_signed(sign_group(account, group))


def test_a_trained_hash_is_refused_after_a_flood_pushes_it_out_of_the_seen_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real cap is 65,536 seen hashes; a 67,500-group flood let a trained group back in.
    # The same overflow at 1/1000 of the size (the cap is read at each admission).
    monkeypatch.setattr(collector_module, "SEEN_HASHES_MAX", 64)
    collector = new_collector(buffer_max_groups=16)
    now_ms = int(time.time() * 1000)
    trained = wire(make_group(PEER, index=0, created_at_ms=now_ms))
    item = collector.ingest(trained)
    assert item is not None
    collector.take([item.rollout_hash])
    collector.mark_trained([item.rollout_hash])
    for i in range(1, 100):
        assert collector.ingest(wire(make_group(FLOODER, index=i), FLOODER)) is not None
    assert collector.ingest(trained) is None
    assert collector.statistics().rejected == {"already_trained": 1}


def test_the_buffer_refuses_a_call_from_a_worker_thread() -> None:
    collector = new_collector()
    assert collector.ingest(wire(make_group(PEER))) is not None
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            collector.candidates()
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert "another thread" in str(errors[0])
    assert len(collector.candidates()) == 1  # the owner thread still reads it


def test_a_dropped_group_leaves_the_buffer_and_is_counted_by_reason() -> None:
    collector = new_collector()
    first = wire(make_group(PEER, index=1))
    a = collector.ingest(first)
    b = collector.ingest(wire(make_group(PEER, index=2)))
    assert a is not None
    assert b is not None
    assert collector.drop([a.rollout_hash, b"\x00" * 32], "implausible") == 1
    stats = collector.statistics()
    assert [c.rollout_hash for c in collector.candidates()] == [b.rollout_hash]
    assert stats.dropped == {"implausible": 1}
    assert collector.ingest(first) is None  # still a duplicate, never back in the buffer


def test_a_quarantined_producer_is_refused_before_its_signature_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    real = signing.recover_signer

    def counting(digest: bytes, signature: bytes) -> str:
        calls.append(digest)
        return real(digest, signature)

    monkeypatch.setattr(signing, "recover_signer", counting)
    quarantine = Quarantine(rate=0.5, min_events=1, duration_s=60)
    assert quarantine.record(FLOODER.address, dropped=True)
    collector = new_collector(checks=[QuarantineCheck(quarantine)])
    assert collector.ingest(wire(make_group(FLOODER), FLOODER)) is None
    assert collector.ingest(wire(make_group(PEER))) is not None
    assert collector.statistics().rejected == {"quarantined": 1}
    assert len(calls) == 1
