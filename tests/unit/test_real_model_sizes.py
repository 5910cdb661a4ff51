"""`sapo-async swarm --model` and the explorer's demo size a real model's round on their own."""

from __future__ import annotations

from sapo_async.cli.swarm import _sizes
from sapo_async.limits import REAL_MODEL_SIZES


def test_the_tiny_model_keeps_the_specs_sizes() -> None:
    assert _sizes("tiny", None, None, None) == {}
    assert _sizes("tiny", 2, None, 8) == {"questions_per_round": 2, "max_new_tokens": 8}


def test_a_real_model_gets_real_sizes_and_asked_ones_win() -> None:
    assert _sizes("smollm2-135m", None, None, None) == REAL_MODEL_SIZES
    assert _sizes("smollm2-135m", None, 2, 64) == {
        **REAL_MODEL_SIZES,
        "completions_per_question": 2,
        "max_new_tokens": 64,
    }
