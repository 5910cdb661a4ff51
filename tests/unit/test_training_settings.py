"""The trainer's settings reach it from node.toml and from ``Swarm.join`` keywords.

One completion length (``max_new_tokens``) sets the trainer's cap; truncated IS, micro-
batches, activation checkpointing and bf16 have config keys; a bad value is refused with
the field named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.node.spec import NodeSpec
from sapo_async.ops.config import load_config
from sapo_async.policy.grpo import TrainerConfig


def test_node_toml_training_keys_reach_the_trainer(tmp_path: Path) -> None:
    from eth_account import Account

    from sapo_async.ops.hardware import HardwareChoice

    cfg = load_config(
        node={"data_dir": str(tmp_path)},
        training={
            "max_new_tokens": 512,
            "loss_type": "dr_grpo",
            "tis_cap": 2.0,
            "tis_level": "sequence",
            "micro_batch_tokens": 8192,
            "gradient_checkpointing": True,
            "bf16": True,
        },
    )
    hardware = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
    trainer = cfg.to_spec(account=Account.create(), hardware=hardware).training.trainer_config()
    assert trainer.max_completion_tokens == 512
    assert (trainer.tis_cap, trainer.tis_level) == (2.0, "sequence")
    assert trainer.micro_batch_tokens == 8192
    assert trainer.gradient_checkpointing
    assert trainer.bf16
    assert trainer.aggregation == "dr_grpo"


def test_truncated_is_is_off_unless_set() -> None:
    trainer = NodeSpec.build().training.trainer_config()
    assert trainer.tis_cap is None
    assert trainer.max_completion_tokens == NodeSpec().training.max_new_tokens


def test_swarm_join_keywords_set_the_completion_length_and_truncated_is() -> None:
    spec = NodeSpec.build(max_new_tokens=300, tis_cap=3.0, tis_level="sequence")
    trainer = spec.training.trainer_config()
    assert (trainer.max_completion_tokens, trainer.tis_cap, trainer.tis_level) == (
        300,
        3.0,
        "sequence",
    )
    # a trainer given whole keeps its own settings, with the round's completion length
    given = NodeSpec.build(max_new_tokens=40, trainer=TrainerConfig(lr=1e-6, tis_cap=1.5))
    trainer = given.training.trainer_config()
    assert (trainer.lr, trainer.tis_cap, trainer.max_completion_tokens) == (1e-6, 1.5, 40)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"tis_cap": 0.0}, "training.tis_cap"),
        ({"tis_level": "batch"}, "training.tis_level"),
        ({"tis_cap": 2.0, "trainer": TrainerConfig(tis_cap=3.0)}, "training.trainer.tis_cap"),
    ],
)
def test_bad_truncated_is_settings_are_refused_by_name(settings: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        NodeSpec.build(**settings)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("training", "key"),
    [({"tis_cap": -1}, "tis_cap"), ({"micro_batch_tokens": 0}, "micro_batch_tokens")],
)
def test_node_toml_refuses_bad_training_values_naming_the_key(
    tmp_path: Path, training: dict, key: str
) -> None:
    with pytest.raises(ConfigError, match=f"training.{key}"):
        load_config(node={"data_dir": str(tmp_path)}, training=training)


def test_the_gpu_example_trains_every_completion_token_with_truncated_is(tmp_path: Path) -> None:
    from eth_account import Account

    from sapo_async.ops.hardware import HardwareChoice

    example = Path(__file__).resolve().parents[2] / "examples" / "gpu_node.toml"
    cfg = load_config(example, node={"data_dir": str(tmp_path)})
    hardware = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
    trainer = cfg.to_spec(account=Account.create(), hardware=hardware).training.trainer_config()
    assert trainer.max_completion_tokens == 512
    assert trainer.tis_cap == 2.0
    assert trainer.micro_batch_tokens == 8192
