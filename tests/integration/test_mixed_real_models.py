"""Honest SmolLM2 and tiny-model groups through each other's defences (issue 22, item 5).

A small run of ``bench/defence_fp.py`` (the full one is ``just bench defence_fp``): each
model produces honest groups through the product's own path (generate, wire group, signed
and verified), and each receiver calibrates on its own round and screens them with
``select_groups`` and the defences on. What it pins is what was measured:

* SmolLM2 receivers drop none of SmolLM2's or the tiny model's honest groups;
* a tiny-model receiver drops SmolLM2's honest groups exactly when a completion, in the tiny
  model's character tokens, is longer than the tiny node's own ``max_new_tokens`` + 1
  (``completion_too_many_tokens``): the size bound is counted in the *receiver's* tokens,
  so BPE text that fits the producer's budget overflows a character tokenizer's. A fix of
  that check (see docs/security.md) must change the second assertion.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.defence_fp import Sizes, run

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.real_model]

SIZES = Sizes(
    groups=2,
    calibration_groups=2,
    questions_per_round=2,
    completions=4,
    max_new_tokens=12,
    families=("basic_arithmetic",),
    seed=7,
    models=("tiny", "smollm2-135m"),
    calibration_min=8,  # one own round of 2 x 4 completions calibrates plausibility
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pair(result: dict[str, Any], producer: str, receiver: str) -> dict[str, Any]:
    return next(
        p for p in result["pairs"] if p["producer"] == producer and p["receiver"] == receiver
    )


@pytest.mark.timeout(600)
async def test_honest_smollm2_groups_pass_smollm2_defences_and_overflow_only_tiny_size_bound():
    result = await run(SIZES)
    # The receivers' plausibility floors are calibrated, so the check is really on.
    for receiver in SIZES.models:
        floor = result["thresholds"][receiver]["families"]["basic_arithmetic"]
        assert floor["min_mean_logprob"] is not None
    for producer in SIZES.models:
        verdict = _pair(result, producer, "smollm2-135m")
        assert verdict["groups"] == SIZES.groups
        assert verdict["admission_refused"] == {}
        assert verdict["dropped"] == {}, verdict["drops"]
    tiny_of_tiny = _pair(result, "tiny", "tiny")
    assert tiny_of_tiny["dropped"] == {}
    # The cross-tokenizer size bound: dropped iff a completion overflows in tiny tokens.
    cross = _pair(result, "smollm2-135m", "tiny")
    overflowing = cross["as_if_pushed"]["groups_over_max_tokens"]
    assert overflowing >= 1  # SmolLM2's words are letters: one <unk> each in tiny tokens
    assert cross["dropped"] == {"completion_too_many_tokens": overflowing}
