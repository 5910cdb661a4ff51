"""Shared fixtures. Area fixtures live in tests/<area>_fixtures.py modules loaded here."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator

import pytest

# Tests build their own tiny models; nothing may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Each area keeps its fixtures in its own module so areas never edit the same file.
pytest_plugins = [
    "tests.fixtures.disk",
    "tests.fixtures.fabric",
    "tests.fixtures.learning",
    "tests.fixtures.ledger",
    "tests.fixtures.volunteer",
]


# nats-py leaves the connection of a failed reconnect open when it drops it (see the
# StreamWriter filter in pyproject.toml): its socket and transport are freed by the cycle
# collector, often during a later, unrelated test, which then fails on the unraisable
# ResourceWarning (seen on a loaded CI run: a test of the generation backends failed on the
# socket of a reconnect to the server test_fabric_restart had killed). Tests that run a
# nats-server collect garbage before they end, so such a leak surfaces inside them, where
# it is tolerated; every other test stays strict about unclosed sockets.
_NATS_PY_LEAKS = (
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    "ignore:Exception ignored in.*_SelectorTransport.__del__"
    ":pytest.PytestUnraisableExceptionWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("nats") is not None:
            for spec in _NATS_PY_LEAKS:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(autouse=True)
def _collect_nats_py_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.node.get_closest_marker("nats") is not None:
        gc.collect()


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Undo what a test's configure_logging() (a CLI command run in-process) did to the
    package's and the root logger, so the next test starts with the library silent."""
    package, root = logging.getLogger("sapo_async"), logging.getLogger()
    saved = (package.handlers[:], package.level, package.propagate, root.handlers[:], root.level)
    yield
    package.handlers[:], root.handlers[:] = saved[0], saved[3]
    package.setLevel(saved[1])
    package.propagate = saved[2]
    root.setLevel(saved[4])
