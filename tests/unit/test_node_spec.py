"""NodeSpec: flat settings land in the right part, and bad values name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.node.spec import (
    CheckpointSpec,
    LedgerSpec,
    NodeSpec,
    PolicySpec,
    TrainingSpec,
)
from sapo_async.node.swarm import Swarm, _connect_with_backoff


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_defaults_make_a_valid_spec_with_every_part() -> None:
    spec = NodeSpec()
    assert spec.training == TrainingSpec()
    assert spec.ledger.enabled
    assert spec.checkpoint.dir is None


def test_flat_settings_go_to_the_part_that_declares_them() -> None:
    spec = NodeSpec.build(
        swarm="demo",
        local=2,
        external=6,
        questions_per_round=4,
        regime="dense",
        include_tokens=False,
        checkpoint_every=5,
        ledger_enabled=False,
    )
    assert spec.swarm == "demo"
    assert (spec.training.local, spec.training.external) == (2, 6)
    assert spec.training.questions_per_round == 4
    assert spec.policy.regime == "dense"
    assert spec.fabric.include_tokens is False
    assert spec.checkpoint.every == 5
    assert spec.ledger.enabled is False


def test_replace_keeps_what_it_does_not_name() -> None:
    base = NodeSpec.build(local=2, external=2, seed=7)
    spec = base.replace(name="n1", external=3)
    assert spec.name == "n1"
    assert (spec.training.local, spec.training.external, spec.training.seed) == (2, 3, 7)
    assert base.training.external == 2  # frozen: the original is unchanged


def test_a_whole_part_is_accepted_by_its_name() -> None:
    spec = NodeSpec.build(ledger=LedgerSpec(enabled=False), policy=PolicySpec(device="cuda"))
    assert not spec.ledger.enabled
    assert spec.policy.device == "cuda"


def test_unknown_setting_is_named_with_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match="unknown node setting 'questions'") as err:
        NodeSpec.build(questions=4)
    assert err.value.field == "questions"
    assert "questions_per_round" in str(err.value)


def test_a_part_given_whole_and_by_field_is_refused() -> None:
    with pytest.raises(ConfigError, match="given whole and field by field"):
        NodeSpec.build(checkpoint=CheckpointSpec(), checkpoint_every=3)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"local": 0, "external": 0}, "training.local"),
        ({"local": 9, "questions_per_round": 8}, "training.local"),
        ({"sampler": "best"}, "training.sampler"),
        ({"top_p": 0.0}, "training.top_p"),
        ({"per_producer_cap": 0}, "training.per_producer_cap"),
        ({"backend": "onnx"}, "policy.backend"),
        ({"gpu_memory_utilization": 1.5}, "policy.gpu_memory_utilization"),
        ({"start": "yesterday"}, "fabric.start"),
        ({"stream_replicas": 0}, "fabric.stream_replicas"),
        ({"checkpoint_every": 0}, "checkpoint.every"),
        ({"rpc_url": "http://127.0.0.1:8545"}, "ledger.contract_address"),
        (
            {"rpc_url": "http://127.0.0.1:8545", "contract_address": "0x" + "1" * 40},
            "ledger.journal_path",
        ),
        ({"node_index": 1 << 20}, "node_index"),
        ({"drain_timeout_s": 0}, "drain_timeout_s"),
        ({"sleep_mode": True, "overlap": True}, "policy.sleep_mode"),
    ],
)
def test_invalid_value_raises_config_error_naming_the_field(settings, field) -> None:
    with pytest.raises(ConfigError) as err:
        NodeSpec.build(**settings)
    assert err.value.field == field
    assert field.split(".")[-1] in str(err.value)


def test_a_ledger_rpc_url_with_contract_and_journal_is_valid(tmp_path: Path) -> None:
    spec = NodeSpec.build(
        rpc_url="http://127.0.0.1:8545",
        contract_address="0x" + "1" * 40,
        journal_path=tmp_path / "journal.sqlite",
    )
    assert spec.ledger.rpc_url == "http://127.0.0.1:8545"


def test_swarm_join_refuses_a_bad_setting_before_building_anything() -> None:
    with pytest.raises(ConfigError) as err:
        Swarm.join(swarm="demo", local=4, questions=8)
    assert err.value.field == "questions"


@pytest.mark.anyio
async def test_joining_nats_gives_up_once_the_next_retry_would_pass_the_deadline() -> None:
    attempts = 0

    async def unreachable() -> None:
        nonlocal attempts
        attempts += 1
        raise TransportUnavailable("connection refused")

    with pytest.raises(TransportUnavailable, match="still unreachable after 0 s"):
        await _connect_with_backoff(unreachable, what="NATS at test", timeout_s=0.1)
    assert attempts == 1  # the first back-off delay (0.5 s) is already past the deadline
