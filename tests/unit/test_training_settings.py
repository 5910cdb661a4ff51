"""The trainer's settings reach it from node.toml and from ``Swarm.join`` keywords.

One completion length (``max_new_tokens``) sets the trainer's cap (derived once, in
``LearnerSettings.trainer_config``); truncated IS, micro-batches, activation checkpointing
and bf16 have config keys under the trainer's own names; a bad value is refused with the
field named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sapo_async.errors import ConfigError
from sapo_async.node.learner import LearnerSettings
from sapo_async.node.spec import NodeSpec, TrainingSpec
from sapo_async.ops.config import load_config
from sapo_async.policy.grpo import TrainerConfig


def trainer_of(training: TrainingSpec) -> TrainerConfig:
    """The TrainerConfig a node with this round gets (what build_learner hands the Trainer)."""
    settings = LearnerSettings.of(
        training, node_index=0, prompt_style="compact", chat_template=False
    )
    return settings.trainer_config()


def _spec_of(cfg, tmp_path: Path):  # type: ignore[no-untyped-def]
    from eth_account import Account

    from sapo_async.ops.hardware import HardwareChoice

    hardware = HardwareChoice("transformers", "cpu", "tiny", None, "test", None, None)
    return cfg.to_spec(account=Account.create(), hardware=hardware)


def test_node_toml_training_keys_reach_the_trainer(tmp_path: Path) -> None:
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
    trainer = trainer_of(_spec_of(cfg, tmp_path).training)
    assert trainer.max_completion_tokens == 512
    assert (trainer.tis_cap, trainer.tis_level) == (2.0, "sequence")
    assert trainer.micro_batch_tokens == 8192
    assert trainer.gradient_checkpointing
    assert trainer.bf16
    assert trainer.loss_type == "dr_grpo"


def test_truncated_is_is_off_unless_set() -> None:
    trainer = trainer_of(NodeSpec.build().training)
    assert trainer.tis_cap is None
    assert trainer.max_completion_tokens == NodeSpec().training.max_new_tokens


def test_swarm_join_keywords_set_the_completion_length_and_truncated_is() -> None:
    spec = NodeSpec.build(max_new_tokens=300, tis_cap=3.0, tis_level="sequence")
    trainer = trainer_of(spec.training)
    assert (trainer.max_completion_tokens, trainer.tis_cap, trainer.tis_level) == (
        300,
        3.0,
        "sequence",
    )
    # a trainer given whole keeps its own settings, with the round's completion length
    given = NodeSpec.build(max_new_tokens=40, trainer=TrainerConfig(lr=1e-6, tis_cap=1.5))
    trainer = trainer_of(given.training)
    assert (trainer.lr, trainer.tis_cap, trainer.max_completion_tokens) == (1e-6, 1.5, 40)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"tis_cap": 0.0}, "trainer.tis_cap"),
        ({"tis_level": "batch"}, "trainer.tis_level"),
        ({"tis_cap": 2.0, "trainer": TrainerConfig(tis_cap=3.0)}, "trainer"),
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


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("aggregation", "loss_type"),
        ("eps_low", "clip_low"),
        ("eps_high", "clip_high"),
        ("beta", "kl_beta"),
    ],
)
def test_the_trainers_old_field_names_are_refused_naming_the_new_one(old: str, new: str) -> None:
    with pytest.raises(ConfigError, match=f"{old} is now called {new}"):
        TrainerConfig(**{old: 0.1})


def test_the_gpu_example_trains_every_completion_token_with_truncated_is(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "gpu_node.toml"
    cfg = load_config(example, node={"data_dir": str(tmp_path)})
    trainer = trainer_of(_spec_of(cfg, tmp_path).training)
    assert trainer.max_completion_tokens == 512
    assert trainer.tis_cap == 2.0
    assert trainer.micro_batch_tokens == 8192
