"""The suite's own rules: a leak nats-py makes inside a test that runs a nats-server stays
inside that test (tests/conftest.py), and any other test still fails on a leaked socket."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

LEAKING = """
import gc
import socket

import pytest


class Cycle:  # freed only by the cycle collector, as nats-py's dropped connection is
    def __init__(self):
        self.me = self
        self.sock = socket.socket()


@pytest.mark.nats
def test_a_nats_test_whose_client_leaks_a_connection():
    Cycle()


def test_an_unrelated_test_that_runs_next():
    gc.collect()  # torch and friends trigger the collector at any time; here, on purpose
"""

PLAIN_LEAK = """
import gc
import socket


class Cycle:
    def __init__(self):
        self.me = self
        self.sock = socket.socket()


def test_a_test_that_leaks_its_own_socket():
    Cycle()
    gc.collect()
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    pytester.makeini("[pytest]\nfilterwarnings = error\nmarkers =\n    nats: runs a nats-server\n")
    pytester.makeconftest(
        "from tests.conftest import _collect_nats_py_leaks, pytest_collection_modifyitems\n"
    )
    return pytester


def test_a_leak_in_a_nats_test_does_not_fail_the_next_test(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_leak=LEAKING)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_a_socket_leaked_outside_a_nats_test_still_fails_it(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_plain=PLAIN_LEAK)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
