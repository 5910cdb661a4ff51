"""The in-memory broker's de-duplication window (the JetStream look-alike's own logic)."""

from __future__ import annotations

from sapo_async.fabric.transport.memory import MemoryBroker


def test_ids_are_forgotten_oldest_first_once_out_of_the_window() -> None:
    """Expiry pops ids from the front in the order they were stored (a flood's thousands
    of ids were scanned whole on every store and fetch) and keeps every id still inside
    the window."""
    now = [1_000.0]
    broker = MemoryBroker(duplicate_window=10.0, clock=lambda: now[0])
    subject = "sapo.s.rollouts.chain_sum"
    for i in range(3000):
        now[0] += 0.01 if i else 0.0  # ids 0..2999 stored over about 30 s
        assert not broker.store("s", subject, b"x", f"id{i}").duplicate
    dedup = broker.stream("s").dedup
    assert len(dedup) == 1001  # the last 10 s: ids 1999..2999
    assert next(iter(dedup)) == "id1999"
    assert broker.store("s", subject, b"x", "id2999").duplicate
    assert not broker.store("s", subject, b"x", "id0").duplicate  # forgotten: stored again
    now[0] += 10.5
    assert not broker.store("s", subject, b"x", "id2999").duplicate
    assert list(dedup) == ["id2999"]  # id0 aged out with the rest
