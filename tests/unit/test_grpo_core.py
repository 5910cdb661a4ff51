"""GRPO maths against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from sapo_async.errors import ConfigError
from sapo_async.policy.grpo.core import (
    aggregate,
    group_advantages,
    k3_kl,
    policy_loss,
    truncated_is_weights,
)


def test_std_advantages_of_a_binary_group_are_plus_minus_one() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1, -1, -1, 1], rel=1e-5)


def test_std_advantages_match_hand_computed_values() -> None:
    # mean 0.25, population std sqrt(0.1875) = 0.4330127
    expected = [-0.25 / 0.4330127] * 3 + [0.75 / 0.4330127]
    assert group_advantages([0.0, 0.0, 0.0, 1.0]) == pytest.approx(expected, rel=1e-5)


def test_mean_only_advantages_are_centred_rewards() -> None:
    assert group_advantages([0.0, 0.0, 0.0, 1.0], mode="mean") == pytest.approx(
        [-0.25, -0.25, -0.25, 0.75]
    )


@pytest.mark.parametrize("mode", ["std", "mean"])
def test_all_equal_rewards_give_zero_advantages(mode: str) -> None:
    assert group_advantages([0.3] * 4, mode=mode) == [0.0] * 4  # type: ignore[arg-type]


def test_a_single_completion_has_zero_advantage() -> None:
    assert group_advantages([1.0]) == [0.0]


@pytest.mark.parametrize("rewards", [[], [0.0, math.nan], [math.inf, 0.0]])
def test_empty_or_non_finite_rewards_are_rejected(rewards: list[float]) -> None:
    with pytest.raises(ConfigError):
        group_advantages(rewards)


def test_unknown_advantage_mode_is_rejected() -> None:
    with pytest.raises(ConfigError, match="advantage mode"):
        group_advantages([0.0, 1.0], mode="median")  # type: ignore[arg-type]


# Two sequences: advantages +1 and -3; the first has 2 completion tokens, the second 1.
# At ratio 1 the per-token loss is -A, so the masked sums are -2 and +3.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -3.0])


def _on_policy(garbage_in_padding: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.log(torch.full((2, 3), 0.5))
    logp = old.clone()
    if garbage_in_padding:
        logp[0, 2] = 5.0  # ratio e^5.7 on a padded position must change nothing
        logp[1, 1:] = -9.0
    return logp.requires_grad_(), old


@pytest.mark.parametrize(
    ("aggregation", "max_tokens", "expected"),
    [
        ("grpo", None, (-1.0 + 3.0) / 2),  # per-sequence means -1 and +3, then mean
        ("dapo", None, (-2.0 + 3.0) / 3),  # token mean over the 3 real tokens
        ("dr_grpo", None, (-2.0 + 3.0) / (2 * 3)),  # B x T
        ("dr_grpo", 4, (-2.0 + 3.0) / (2 * 4)),  # B x the constant
    ],
)
def test_each_aggregation_matches_hand_computed_loss_and_ignores_padding(
    aggregation: str, max_tokens: int | None, expected: float
) -> None:
    logp, old = _on_policy()
    terms = policy_loss(logp, old, ADV, MASK, aggregation=aggregation, max_tokens=max_tokens)  # type: ignore[arg-type]
    assert float(terms.loss.detach()) == pytest.approx(expected)
    assert terms.clip_fraction == 0.0
    assert terms.ratio_mean == pytest.approx(1.0)


def test_padding_gets_no_gradient() -> None:
    logp, old = _on_policy()
    policy_loss(logp, old, ADV, MASK, aggregation="dapo").loss.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    assert logp.grad[0, 2] == 0.0
    assert torch.all(logp.grad[1, 1:] == 0.0)
    # d(-A * ratio)/d logp = -A / 3 tokens at ratio 1
    assert logp.grad[0, 0] == pytest.approx(-1.0 / 3)
    assert logp.grad[1, 0] == pytest.approx(3.0 / 3)


def test_a_sequence_without_tokens_counts_as_zero_in_grpo_mean() -> None:
    per_token = torch.tensor([[2.0, 4.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert float(aggregate(per_token, mask, "grpo")) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("delta", "adv", "loss", "clipped"),
    [
        (0.5, 1.0, -1.28, 1.0),  # ratio 1.65 > 1 + 0.28 and A > 0: clipped at 1.28
        (math.log(0.5), -1.0, 0.8, 1.0),  # ratio 0.5 < 1 - 0.2 and A < 0: clipped at 0.8
        (0.5, -1.0, math.exp(0.5), 0.0),  # ratio above the clip but A < 0: unclipped
        (0.1, 1.0, -math.exp(0.1), 0.0),  # inside the band
    ],
)
def test_asymmetric_clip(delta: float, adv: float, loss: float, clipped: float) -> None:
    old = torch.tensor([[-1.0]])
    logp = (old + delta).requires_grad_()
    terms = policy_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1))
    assert float(terms.loss.detach()) == pytest.approx(loss, rel=1e-5)
    assert terms.clip_fraction == clipped
    terms.loss.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    assert (float(logp.grad[0, 0]) == 0.0) == bool(clipped)


def test_k3_kl_matches_hand_computed_value_and_enters_the_loss_with_beta() -> None:
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    expected = 0.5 + math.log(2.0) - 1.0  # exp(d) - d - 1 with d = log(0.5)
    assert float(k3_kl(logp, ref)) == pytest.approx(expected)
    terms = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1), beta=0.1, ref_logp=ref)
    assert float(terms.loss.detach()) == pytest.approx(0.1 * expected)
    assert terms.kl == pytest.approx(expected)


def test_kl_is_reported_but_not_added_with_beta_zero() -> None:
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    terms = policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 1), ref_logp=ref)
    assert float(terms.loss.detach()) == 0.0
    assert terms.kl == pytest.approx(0.5 + math.log(2.0) - 1.0)  # reported: k3 at d = log 0.5


def test_beta_without_reference_is_rejected() -> None:
    x = torch.zeros(1, 1)
    with pytest.raises(ConfigError, match="reference"):
        policy_loss(x, x, torch.zeros(1), torch.ones(1, 1), beta=0.1)


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ConfigError, match="shape"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 2))
    with pytest.raises(ConfigError, match="advantages"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))


def test_truncated_importance_weights_cap_and_default_to_one() -> None:
    old = torch.log(torch.tensor([[0.6, 0.3], [0.5, 0.5]]))
    behaviour = torch.log(torch.tensor([[0.2, 0.3], [0.1, 0.1]]))
    w = truncated_is_weights(old, behaviour, torch.tensor([True, False]), cap=2.0)
    # the ratio 3 is capped at 2; row 2 has no behaviour log-probs
    assert w.flatten().tolist() == pytest.approx([2.0, 1.0, 1.0, 1.0])


def test_sequence_level_importance_weight_is_the_capped_product_over_completion_tokens() -> None:
    old = torch.log(torch.tensor([[0.6, 0.3, 0.9], [0.5, 0.5, 0.9], [0.4, 0.4, 0.4]]))
    behaviour = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.1, 0.5, 0.9], [0.8, 0.4, 0.4]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    w = truncated_is_weights(
        old, behaviour, torch.tensor([True, True, True]), cap=2.0, level="sequence", mask=mask
    )
    # row 1: 1.5 x 1.5 = 2.25 (the padded third token does not count) -> capped at 2;
    # row 2: 5 x 1 x 1 -> 2; row 3: 0.5 x 1 x 1, the same weight on every token
    assert w.flatten().tolist() == pytest.approx([2.0] * 6 + [0.5] * 3)
    token = truncated_is_weights(old, behaviour, torch.tensor([True] * 3), cap=2.0)
    assert token[0].tolist() == pytest.approx([1.5, 1.5, 2.0])
    with pytest.raises(ConfigError, match="tis_level"):
        truncated_is_weights(old, behaviour, torch.tensor([True] * 3), cap=2.0, level="batch")  # type: ignore[arg-type]


def test_micro_batch_losses_with_the_batch_counts_add_up_to_the_batch_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(5, 4, generator=gen) * 0.1 - 1.0
    old = logp + torch.randn(5, 4, generator=gen) * 0.2
    adv = torch.randn(5, generator=gen)
    mask = (torch.rand(5, 4, generator=gen) > 0.3).float()
    mask[:, 0] = 1.0
    for agg in ("grpo", "dapo", "dr_grpo"):
        whole = policy_loss(logp, old, adv, mask, aggregation=agg, max_tokens=6)
        parts = [
            policy_loss(
                logp[s],
                old[s],
                adv[s],
                mask[s],
                aggregation=agg,
                max_tokens=6,
                n_sequences=5,
                n_tokens=float(mask.sum()),
            )
            for s in (slice(0, 2), slice(2, 3), slice(3, 5))
        ]
        assert float(sum(p.loss for p in parts)) == pytest.approx(float(whole.loss), abs=1e-7)
        assert sum(p.clip_fraction for p in parts) == pytest.approx(whole.clip_fraction)
        assert sum(p.ratio_mean for p in parts) == pytest.approx(whole.ratio_mean)


def test_importance_weights_scale_the_policy_term() -> None:
    old = torch.zeros(1, 1)
    terms = policy_loss(
        old.clone(), old, torch.tensor([1.0]), torch.ones(1, 1), is_weights=torch.full((1, 1), 0.5)
    )
    assert float(terms.loss.detach()) == pytest.approx(-0.5)
