"""Per-producer memories stay bounded however many keys sign groups (issue 54, item 4).

Keys are free: a stranger who signs every group with a new key must not grow a node's
per-producer state without bound. Each bounded memory is fed a flood of 100,000 distinct
producers, one group or verdict each, and must hold at most its bound, stop growing once it
is full (the bytes of all it holds, its tables included), and keep what matters under the
churn: a producer that keeps sending keeps its history, and a quarantined producer stays
quarantined for its whole quarantine time.

Each flood runs once per module (a fixture) and the tests read what it left. The lengths are
read from the memories' private maps: what is bounded is their size.
"""

from __future__ import annotations

import gc
import hashlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType

import msgspec
import pytest

from sapo_async.errors import RejectedInput
from sapo_async.fabric import collector as collector_module
from sapo_async.fabric.admission import Arrival
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.limits import (
    PRODUCER_ROUNDS_REMEMBERED,
    PRODUCERS_REMEMBERED,
    QUARANTINED_MAX,
)
from sapo_async.node.admission import ProducerRoundCap
from sapo_async.node.leads import LeadObservation, LeadRecord
from sapo_async.node.quarantine import Quarantine
from sapo_async.node.windows import ProducerWindows
from sapo_async.wire import RolloutGroup
from sapo_async.wire.signing import DecodedEnvelope
from tests.fixtures.fabric import SWARM, make_account, make_group

FLOOD = 100_000
"""Distinct keys a flood signs with, one group (or verdict) each."""

EVERY = 1_000
"""A producer that keeps sending: one group per this many of the flood's keys (far fewer
keys between two of its groups than any bound)."""

GROWTH = 1.25
"""How much more a bounded memory may hold after the flood than when it first filled (its
hash tables' sizes vary with the churn); an unbounded one holds about 12 times more."""

STEADY = "0x" + "5e" * 20
"""A producer that keeps sending while the flood runs."""

SHARED = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType)
"""What :func:`deep_size` does not count: code, types and modules, shared process-wide."""


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key(i: int) -> str:
    """The flood's i-th producer address (the shape of an address; nothing checks more)."""
    return f"0x{i:040x}"


def digest(i: int) -> bytes:
    return i.to_bytes(32, "big")


def deep_size(root: object) -> int:
    """Bytes of every object reachable from ``root`` but code, types and modules: what the
    memory holds, its tables included."""
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, SHARED):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


@dataclass(frozen=True)
class Flood:
    """What a flood left: the memory's length and its bytes when it first filled (after
    ``2 x bound`` keys) and at the end."""

    length: int
    full: int
    after: int


def flood(
    feed: Callable[[range], None], memory: object, length: Callable[[], int], bound: int
) -> Flood:
    """Feed the flood's 100,000 keys to ``memory`` (by ``feed``)."""
    feed(range(2 * bound))
    full = deep_size(memory)
    feed(range(2 * bound, FLOOD))
    return Flood(length(), full, deep_size(memory))


# --- the quarantine's verdicts --------------------------------------------------------------

STEADY_VERDICTS = [False] * 40 + [True] * 40
"""A producer's verdicts, one per EVERY keys of the flood: with a window of 64 it is
quarantined at its 72nd (the window then holds 32 drops) only if none was forgotten;
forgetting restarts the count and quarantines it at another verdict."""


@dataclass(frozen=True)
class QuarantineFlood(Flood):
    bad_blocked: bool
    bad_blocked_when_its_time_is_up: bool
    steady_entered_at: int


@pytest.fixture(scope="module")
def quarantine_flood() -> QuarantineFlood:
    clock = Clock()
    q = Quarantine(0.5, 8, 600.0, clock=clock)
    assert [q.record("bad", True) for _ in range(8)][-1]
    entered: list[bool] = []

    def feed(keys: range) -> None:
        for i in keys:
            clock.now += 0.001  # 100 s for the flood: within the bad key's quarantine
            q.record(key(i), i % 2 == 0)  # half dropped, none with enough verdicts to judge
            if i % EVERY == 0 and i // EVERY < len(STEADY_VERDICTS):
                entered.append(q.record(STEADY, STEADY_VERDICTS[i // EVERY]))

    result = flood(feed, q, lambda: len(q._verdicts), PRODUCERS_REMEMBERED)
    bad_blocked = q.blocked("bad")
    clock.now = 1600.0  # quarantined at 1000 for 600 s
    return QuarantineFlood(
        **vars(result),
        bad_blocked=bad_blocked,
        bad_blocked_when_its_time_is_up=q.blocked("bad"),
        steady_entered_at=entered.index(True),
    )


def test_quarantine_keeps_verdicts_of_at_most_its_bound_of_producers(
    quarantine_flood: QuarantineFlood,
) -> None:
    assert quarantine_flood.length <= PRODUCERS_REMEMBERED


def test_quarantine_memory_stops_growing_once_full(quarantine_flood: QuarantineFlood) -> None:
    assert quarantine_flood.after <= GROWTH * quarantine_flood.full


def test_quarantine_keeps_a_producer_quarantined_through_the_flood_for_its_time(
    quarantine_flood: QuarantineFlood,
) -> None:
    assert quarantine_flood.bad_blocked
    assert not quarantine_flood.bad_blocked_when_its_time_is_up


def test_quarantine_judges_a_producer_that_keeps_sending_as_if_there_were_no_flood(
    quarantine_flood: QuarantineFlood,
) -> None:
    alone = Quarantine(0.5, 8, 600.0, clock=Clock())
    expected = [alone.record(STEADY, v) for v in STEADY_VERDICTS].index(True)
    assert quarantine_flood.steady_entered_at == expected == 71


# --- the quarantined producers --------------------------------------------------------------


def test_quarantine_holds_at_most_its_bound_of_quarantined_releasing_the_soonest_to_end() -> None:
    clock = Clock()
    q = Quarantine(1.0, 1, 600.0, clock=clock)

    def feed(keys: range) -> None:
        for i in keys:
            clock.now += 0.001  # 100 s for the flood: every quarantine still runs
            q.record(key(i), True)

    result = flood(feed, q, lambda: len(q.active()), QUARANTINED_MAX)
    assert result.length == QUARANTINED_MAX
    assert result.after <= GROWTH * result.full
    assert q.blocked(key(FLOOD - 1))
    assert q.blocked(key(FLOOD - QUARANTINED_MAX))
    assert not q.blocked(key(FLOOD - QUARANTINED_MAX - 1))


# --- the stock-lead record's windows ----------------------------------------------------------


@dataclass(frozen=True)
class WindowsFlood(Flood):
    steady: list[int]
    quiet: list[int]


@pytest.fixture(scope="module")
def windows_flood() -> WindowsFlood:
    windows: ProducerWindows[int] = ProducerWindows(16)
    windows.add("quiet", digest(FLOOD), -1)

    def feed(keys: range) -> None:
        for i in keys:
            if i % EVERY == 0:
                windows.add(STEADY, digest(FLOOD + 1 + i), i)
            windows.add(key(i), digest(i), i)

    result = flood(feed, windows, lambda: len(windows._groups), PRODUCERS_REMEMBERED)
    return WindowsFlood(
        **vars(result), steady=windows.values(STEADY), quiet=windows.values("quiet")
    )


def test_producer_windows_hold_at_most_their_bound_of_producers(
    windows_flood: WindowsFlood,
) -> None:
    assert windows_flood.length <= PRODUCERS_REMEMBERED


def test_producer_windows_memory_stops_growing_once_full(windows_flood: WindowsFlood) -> None:
    assert windows_flood.after <= GROWTH * windows_flood.full


def test_producer_windows_keep_the_history_of_a_producer_that_keeps_sending(
    windows_flood: WindowsFlood,
) -> None:
    assert windows_flood.steady == list(range(FLOOD - 16 * EVERY, FLOOD, EVERY))
    assert windows_flood.quiet == []  # seen once, before the flood: forgotten first


def test_a_copy_of_producer_windows_forgets_in_the_same_order_and_changes_alone() -> None:
    windows: ProducerWindows[int] = ProducerWindows(2)
    for i in range(PRODUCERS_REMEMBERED):
        windows.add(key(i), digest(i), i)
    windows.values(key(0))  # read: the oldest is now the most recently seen
    copy = windows.copy()
    copy.add("new", digest(FLOOD), 0)  # the copy is full: forgets its least recently seen
    assert copy.values(key(0)) == [0]
    assert copy.values(key(1)) == []
    assert windows.values(key(1)) == [1]  # the original is untouched
    assert windows.values("new") == []


def test_stock_lead_record_keeps_judging_peers_that_keep_sending_through_a_key_flood() -> None:
    # Three times through the record's whole memory, not the full flood: the windows are
    # measured above, this is what the record built on them keeps.
    record = LeadRecord(0.5, probation=True)
    filler = ("the answer is", "the answer is")

    def group(producer: str, n: int, leads: tuple[str, ...]) -> LeadObservation:
        return LeadObservation(digest(FLOOD + n), producer, f"q{n % 5}", leads)

    def honest(n: int, leads: tuple[str, ...]) -> LeadObservation:
        return LeadObservation(digest(2 * FLOOD + n), "honest", f"q{n % 5}", leads)

    record.observe(group("filler", n, filler) for n in range(4))
    record.observe(honest(10 + n, (f"{n} + 1 = {n + 1}",)) for n in range(3))
    assert record.stock("filler") == "the answer is"
    assert not record.unproven("honest")
    for n in range(3 * PRODUCERS_REMEMBERED // EVERY):
        record.observe(
            LeadObservation(digest(i), key(i), "q", ("x",))
            for i in range(n * EVERY, (n + 1) * EVERY)
        )
        # Both keep being scored: the filler with its lead, the honest peer often with no
        # rewarded answer at all (nothing added to its window, but it is seen).
        record.observe([group("filler", 20 + n, filler), honest(20 + n, ())])
    assert record.stock("filler") == "the answer is"
    assert not record.unproven("honest")


# --- the producer-round cap -----------------------------------------------------------------


def arrivals(template: RolloutGroup, keys: range, producer_round: int = 0) -> Iterator[Arrival]:
    for i in keys:
        group = msgspec.structs.replace(template, producer=key(i), producer_round=producer_round)
        yield Arrival(group, digest(i), None, None, 0.0, None)


@dataclass(frozen=True)
class CapFlood(Flood):
    refused: int
    tries: int


@pytest.fixture(scope="module")
def cap_flood() -> CapFlood:
    cap = ProducerRoundCap(4)
    template = make_group(make_account(1), completions=1)
    flooder = next(arrivals(template, range(FLOOD, FLOOD + 1), producer_round=7))
    for _ in range(4):
        cap(flooder)
        cap.admitted(flooder)
    tries = refused = 0

    def feed(keys: range) -> None:
        nonlocal tries, refused
        for i, arrival in zip(keys, arrivals(template, keys), strict=True):
            cap(arrival)
            cap.admitted(arrival)
            if i % EVERY == 0:  # the flooder tries again
                tries += 1
                try:
                    cap(flooder)
                except RejectedInput:
                    refused += 1

    result = flood(feed, cap, lambda: len(cap._counts), PRODUCER_ROUNDS_REMEMBERED)
    return CapFlood(**vars(result), refused=refused, tries=tries)


def test_producer_round_cap_counts_at_most_its_bound_of_rounds(cap_flood: CapFlood) -> None:
    assert cap_flood.length <= PRODUCER_ROUNDS_REMEMBERED


def test_producer_round_cap_memory_stops_growing_once_full(cap_flood: CapFlood) -> None:
    assert cap_flood.after <= GROWTH * cap_flood.full


def test_producer_round_cap_still_refuses_a_flooded_round_that_keeps_trying(
    cap_flood: CapFlood,
) -> None:
    assert cap_flood.refused == cap_flood.tries == FLOOD // EVERY


# --- the collector's newest round per producer ----------------------------------------------


def test_collector_remembers_newest_rounds_of_at_most_its_bound_of_producers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Signing 100,000 groups would take minutes: a message's bytes name its producer
    # ("k<i>": the flood's i-th key; "s<round>": a producer that keeps sending) and the
    # decoder builds its group; the signature check passes (what is bounded comes after).
    clock = Clock(2_000_000_000.0)
    template = make_group(make_account(1), completions=1)

    def decode(data: bytes, *, max_bytes: int) -> DecodedEnvelope:
        text = data.decode()
        flood = text.startswith("k")
        group = msgspec.structs.replace(
            template,
            producer=key(int(text[1:])) if flood else STEADY,
            producer_round=0 if flood else int(text[1:].rstrip("x")),
            created_at_ms=int(clock.now * 1000) - 1,  # not in the future by rounding
            question=text,  # each message its own content (one content is admitted once)
        )
        return DecodedEnvelope(None, group, hashlib.sha256(data).digest())  # type: ignore[arg-type]

    monkeypatch.setattr(collector_module, "decode_envelope", decode)
    monkeypatch.setattr(collector_module, "verify_signer", lambda envelope: STEADY)
    collector = Collector(
        MemoryBroker().connect(SWARM),
        buffer_max_groups=16,
        buffer_max_age_s=1.0,
        max_clock_skew_s=0.0,
        max_round_lag=2,
        clock=clock,
    )

    def feed(keys: range) -> None:
        for i in keys:
            clock.now += 0.001
            assert collector.ingest(b"k%d" % i) is not None
            if i % EVERY == 0:  # the steady producer, in round 10 + its count; a round
                assert collector.ingest(b"s%d" % (10 + i // EVERY)) is not None
                collector.candidates()  # a node's round reads the buffer (and tidies it)

    result = flood(feed, collector, lambda: len(collector._newest_round), PRODUCERS_REMEMBERED)
    assert result.length <= PRODUCERS_REMEMBERED
    assert result.after <= GROWTH * result.full
    # Its newest round is still known: a group three rounds behind it is stale.
    newest = 10 + (FLOOD - 1) // EVERY
    assert collector.ingest(b"s%dx" % (newest - 3)) is None
    assert collector.statistics().rejected == {"stale_round": 1}
