import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapo_async.backoff import Backoff, retry_async, retry_delay

pytestmark = pytest.mark.anyio


def test_schedule_doubles_from_base_until_the_cap():
    assert list(Backoff(0.5, 10.0).delays(7)) == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_endless_schedule_keeps_yielding_the_cap():
    tail = list(itertools.islice(Backoff(1.0, 3.0).delays(), 100))
    assert len(tail) == 100
    assert tail[-1] == 3.0


def test_huge_attempt_numbers_do_not_overflow():
    assert retry_delay(10**9, base_s=0.2, max_s=60.0) == 60.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": -1, "base_s": 1.0, "max_s": 2.0},
        {"attempt": 0, "base_s": -1.0, "max_s": 2.0},
        {"attempt": 0, "base_s": 1.0, "max_s": 2.0, "factor": 0.5},
    ],
)
def test_nonsense_schedules_are_refused(kwargs):
    with pytest.raises(ValueError, match="need attempt"):
        retry_delay(**kwargs)


@given(
    base=st.floats(0.0, 100.0),
    cap=st.floats(0.0, 1000.0),
    factor=st.floats(1.0, 10.0),
    n=st.integers(1, 80),
)
def test_delays_never_decrease_and_never_pass_the_cap(base, cap, factor, n):
    delays = list(Backoff(base, cap, factor).delays(n))
    assert len(delays) == n
    assert delays[0] == min(base, cap)
    assert all(a <= b for a, b in itertools.pairwise(delays))
    assert max(delays) <= cap


@given(
    base=st.floats(0.0, 100.0),
    cap=st.floats(0.0, 1000.0),
    factor=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
    n=st.integers(1, 80),
)
def test_jittered_delays_lie_between_the_schedule_and_the_jitter_above_it(
    base, cap, factor, jitter, seed, n
):
    plain = Backoff(base, cap, factor)
    jittered = Backoff(base, cap, factor, jitter=jitter)
    for nominal, delay in zip(
        plain.delays(n), jittered.delays(n, random.Random(seed)), strict=True
    ):
        assert nominal <= delay <= nominal * (1 + jitter)


def test_the_same_seed_gives_the_same_jitter_and_nodes_with_other_seeds_drift_apart():
    schedule = Backoff(0.5, 10.0, jitter=0.5)
    first = list(schedule.delays(8, random.Random(1)))
    assert first == list(schedule.delays(8, random.Random(1)))
    nodes = [list(schedule.delays(8, random.Random(seed))) for seed in range(1000)]
    instants = {round(sum(delays), 3) for delays in nodes}
    assert len(instants) > 900  # a thousand nodes no longer return at one instant


def test_a_jitter_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="jitter"):
        Backoff(1.0, 2.0, jitter=1.5)


class FakeTime:
    """A clock that only sleeping moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay


def failing(times: int, error: Exception | None = None):
    error = error or ConnectionError("down")
    calls = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "up"

    return attempt, calls


async def test_retry_async_returns_once_an_attempt_succeeds_and_reports_each_retry():
    time = FakeTime()
    attempt, calls = failing(3)
    retries = []
    result = await retry_async(
        attempt,
        retry_on=(ConnectionError,),
        schedule=Backoff(1.0, 4.0),
        attempts=5,
        on_retry=lambda n, exc, delay: retries.append((n, str(exc), delay)),
        sleep=time.sleep,
        clock=time.clock,
    )
    assert result == "up"
    assert len(calls) == 4
    assert retries == [(1, "down", 1.0), (2, "down", 2.0), (3, "down", 4.0)]


async def test_retry_async_stops_at_its_deadline_with_the_last_error_never_sleeping_past_it():
    time = FakeTime()
    attempt, calls = failing(10**9)
    with pytest.raises(ConnectionError, match="down"):
        await retry_async(
            attempt,
            retry_on=(ConnectionError,),
            schedule=Backoff(1.0, 4.0, jitter=0.5),
            timeout_s=20.0,
            rng=random.Random(7),
            sleep=time.sleep,
            clock=time.clock,
        )
    assert time.now <= 20.0
    assert time.now > 20.0 - 4.0 * 1.5  # it used its time: the next sleep would pass the end
    assert len(calls) == len(time.sleeps) + 1


async def test_retry_async_gives_up_after_its_attempts():
    time = FakeTime()
    attempt, calls = failing(10**9)
    with pytest.raises(ConnectionError):
        await retry_async(
            attempt,
            retry_on=(ConnectionError,),
            schedule=Backoff(0.1, 0.1),
            attempts=3,
            sleep=time.sleep,
            clock=time.clock,
        )
    assert len(calls) == 3
    assert len(time.sleeps) == 2


@pytest.mark.parametrize(
    ("error", "retry_on", "give_up_on"),
    [
        (KeyError("bug"), (ConnectionError,), ()),
        (ConnectionRefusedError("refused"), (OSError,), (ConnectionRefusedError,)),
    ],
    ids=["not_retried", "final"],
)
async def test_retry_async_raises_at_once_on_an_error_it_does_not_retry_or_one_that_is_final(
    error, retry_on, give_up_on
):
    time = FakeTime()
    attempt, calls = failing(1, error)
    with pytest.raises(type(error)):
        await retry_async(
            attempt,
            retry_on=retry_on,
            give_up_on=give_up_on,
            schedule=Backoff(0.1, 0.1),
            attempts=5,
            sleep=time.sleep,
            clock=time.clock,
        )
    assert len(calls) == 1
    assert time.sleeps == []


async def test_retry_async_refuses_a_retry_without_an_end():
    attempt, _ = failing(0)
    with pytest.raises(ValueError, match="must end"):
        await retry_async(attempt, retry_on=(ConnectionError,), schedule=Backoff(0.1, 0.1))
