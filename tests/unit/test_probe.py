"""The weight-sync probe on CPU with two real transformers models."""

from __future__ import annotations

import math

import pytest
import torch

from sapo_async.errors import WeightSyncError
from sapo_async.limits import PROBE_MAX_LOGPROB_DIFF
from sapo_async.policy.generation.probe import (
    ProbeResult,
    causal_lm_token_logprobs,
    check_probe,
    compare_logprobs,
)
from tests.unit.fake_vllm import tiny_causal_lm

PROBE_IDS = [1, 17, 42, 5, 99, 23, 64, 8, 77, 3, 120, 11]


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)


def test_identical_weights_pass_the_probe() -> None:
    trainer = tiny_causal_lm(seed=0)
    engine = tiny_causal_lm(seed=1)
    engine.load_state_dict(trainer.state_dict())

    result = check_probe(
        compare_logprobs(
            causal_lm_token_logprobs(engine, PROBE_IDS),
            causal_lm_token_logprobs(trainer, PROBE_IDS),
        )
    )

    assert result.ok
    assert result.mean_abs_diff < 1e-5
    assert result.n_tokens == len(PROBE_IDS) - 1


def test_perturbed_weights_fail_the_probe() -> None:
    trainer = tiny_causal_lm(seed=0)
    engine = tiny_causal_lm(seed=0)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(7)
        for p in engine.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)

    result = compare_logprobs(
        causal_lm_token_logprobs(engine, PROBE_IDS),
        causal_lm_token_logprobs(trainer, PROBE_IDS),
    )

    assert not result.ok
    assert result.mean_abs_diff > PROBE_MAX_LOGPROB_DIFF
    with pytest.raises(WeightSyncError) as caught:
        check_probe(result)
    assert caught.value.mismatch == result.mean_abs_diff
    assert caught.value.threshold == PROBE_MAX_LOGPROB_DIFF


def test_bf16_copy_of_the_trainer_passes_the_probe() -> None:
    # The real colocated case: the engine holds bf16 weights, the trainer fp32.
    trainer = tiny_causal_lm(seed=0)
    engine = tiny_causal_lm(seed=0).to(torch.bfloat16)

    result = compare_logprobs(
        causal_lm_token_logprobs(engine, PROBE_IDS),
        causal_lm_token_logprobs(trainer, PROBE_IDS),
    )

    assert 0 < result.mean_abs_diff < PROBE_MAX_LOGPROB_DIFF


def test_trainer_logprobs_match_a_manual_log_softmax() -> None:
    model = tiny_causal_lm(seed=0)
    ids = torch.tensor([PROBE_IDS])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    expected = [
        float(torch.log_softmax(logits[i], -1)[PROBE_IDS[i + 1]]) for i in range(len(PROBE_IDS) - 1)
    ]

    got = causal_lm_token_logprobs(model, PROBE_IDS)

    assert got == pytest.approx(expected, abs=1e-5)


def test_trainer_logprobs_restore_training_mode() -> None:
    model = tiny_causal_lm(seed=0)
    model.train()
    causal_lm_token_logprobs(model, PROBE_IDS)
    assert model.training


def test_compare_rejects_vectors_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        compare_logprobs([0.0, -1.0], [0.0])


def test_compare_rejects_empty_vectors() -> None:
    with pytest.raises(ValueError, match="empty"):
        compare_logprobs([], [])


def test_compare_rejects_a_non_positive_threshold() -> None:
    with pytest.raises(ValueError, match="threshold"):
        compare_logprobs([0.0], [0.0], threshold=0.0)


def test_nan_in_engine_logprobs_never_passes() -> None:
    result = compare_logprobs([math.nan, -1.0], [-1.0, -1.0])
    assert result.mean_abs_diff == math.inf
    assert not result.ok


def test_probe_result_reports_mean_and_max() -> None:
    result = compare_logprobs([-1.0, -2.0, -3.0], [-1.0, -2.5, -3.1], threshold=1.0)
    assert result == ProbeResult(pytest.approx(0.2), pytest.approx(0.5), 3, 1.0)
