"""The package's events: stdlib records carrying the event's dict, and the command line's
rendering of them (conftest's _logging_restored undoes each configuration)."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from sapo_async.errors import ConfigError
from sapo_async.logs import Event, configure_logging, get_logger


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Keep:
    handler = Keep()
    package = logging.getLogger("sapo_async")
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    return handler


def test_event_reaches_the_package_logger_as_a_dict_with_bound_and_contextvar_context(
    kept: Keep,
) -> None:
    log = get_logger("collector", actor="collector-ada").bind(swarm="s")
    with structlog.contextvars.bound_contextvars(round=3):
        log.info("rollout_rejected", reason="stale")
    (record,) = kept.records
    assert record.name == "sapo_async.collector"
    assert record.levelno == logging.INFO
    assert record.msg == {
        "component": "collector",
        "actor": "collector-ada",
        "swarm": "s",
        "round": 3,
        "event": "rollout_rejected",
        "reason": "stale",
    }
    assert record.getMessage().startswith("rollout_rejected component='collector' ")


def test_events_below_the_stdlib_level_are_dropped(kept: Keep) -> None:
    get_logger("node").debug("actor_started")
    assert kept.records == []


def test_an_exception_travels_as_the_records_exc_info(kept: Keep) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("node").exception("node_failed")
    (record,) = kept.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert record.exc_info[0] is RuntimeError
    assert "exc_info" not in record.msg


def test_event_reads_as_its_name_and_its_context() -> None:
    assert str(Event(event="node_left")) == "node_left"
    assert str(Event(event="node_left", rounds=3, name="ada")) == "node_left rounds=3 name='ada'"


def test_configured_json_lines_carry_level_and_timestamp_once_per_event_however_often_configured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(json=True, level="INFO")
    configure_logging(json=True, level="INFO")  # replaces, never adds a second handler
    log = get_logger("node", node="0xabc")
    log.debug("hidden")
    log.info("round_completed", round=1)
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("node_failed")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["event"], line["level"]) for line in lines] == [
        ("round_completed", "info"),
        ("node_failed", "error"),
    ]
    assert lines[0]["node"] == "0xabc"
    assert lines[0]["component"] == "node"
    assert lines[0]["timestamp"].endswith("Z")
    assert "ValueError: bad" in lines[1]["exception"]


def test_configure_logging_refuses_an_unknown_level() -> None:
    with pytest.raises(ConfigError, match="unknown log level"):
        configure_logging(level="LOUD")
