import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapo_async.backoff import Backoff, retry_delay


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
