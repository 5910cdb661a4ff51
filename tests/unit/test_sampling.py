"""Explicit sampling filters: temperature, top-k (0 = off), top-p (1 = off)."""

from __future__ import annotations

import math

import pytest
import torch

from sapo_async.errors import ConfigError
from sapo_async.policy.generation.base import check_sampling
from sapo_async.policy.generation.sampling import filter_logits
from sapo_async.wire import SamplingParams

LOGITS = torch.tensor([[0.0, 1.0, 2.0, 3.0]])


def _kept(out: torch.Tensor) -> list[bool]:
    return torch.isfinite(out)[0].tolist()


def test_no_filter_keeps_everything_and_top_k_zero_is_off() -> None:
    out = filter_logits(LOGITS, SamplingParams(top_k=0, top_p=1.0))
    assert torch.equal(out, LOGITS)


def test_top_k_keeps_the_k_most_likely() -> None:
    assert _kept(filter_logits(LOGITS, SamplingParams(top_k=2))) == [False, False, True, True]


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.5, [False, False, False, True]), (0.7, [False, False, True, True]), (0.99, [True] * 4)],
)
def test_top_p_keeps_the_smallest_prefix_reaching_the_mass(top_p: float, kept: list[bool]) -> None:
    # softmax: 0.032, 0.087, 0.237, 0.644
    assert _kept(filter_logits(LOGITS, SamplingParams(top_p=top_p))) == kept


def test_temperature_divides_logits() -> None:
    out = filter_logits(LOGITS, SamplingParams(temperature=2.0))
    assert out.tolist() == [[0.0, 0.5, 1.0, 1.5]]


@pytest.mark.parametrize(
    ("params", "name"),
    [
        (SamplingParams(temperature=0.0), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (SamplingParams(temperature=math.nan), "temperature"),
    ],
)
def test_bad_sampling_parameters_name_the_field(params: SamplingParams, name: str) -> None:
    with pytest.raises(ConfigError, match=name) as info:
        check_sampling(params)
    assert info.value.field == f"sampling.{name}"
