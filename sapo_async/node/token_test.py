"""A per-token test of whether a completion was sampled from this node's own policy: the
plausibility check for a peer of the node's own model (issue 57, item 3).

The calibrated check (:mod:`.defence`, now only for another model's peers) compares a
completion's mean token log-prob, and the mean of its 3 least likely tokens, with floors
taken from the node's own completions (their 1 % quantile less 1 nat), so it needs
calibration data (peers' groups wait meanwhile) and its floors move with length and family.
For a completion that a peer of the *same model* sampled, the receiver can instead ask a
question with a known answer under the null hypothesis, token by token, from its own
next-token distribution ``p`` at each position (``x`` the token, ``s = -log p_x``):

* **tail mass** ``u = sum(p_v for p_v <= p_x)``: the probability of a token at most as
  likely as the one sampled. A token drawn from ``p`` has ``P(u <= a) <= a`` for every
  ``a`` (a valid p-value, whatever the distribution), so ``min(1, n * min_t u_t)`` over a
  completion's ``n`` tokens is a valid p-value for "no token is out of place" (Bonferroni).
  It reads one out-of-place token (a false number in correct work).
* **surprisal excess** ``z = sum_t(s_t - H_t) / sqrt(sum_t V_t)``, where ``H_t`` is the
  entropy of ``p`` and ``V_t`` the variance of the surprisal under ``p``: the terms have
  mean 0 under the null (a martingale), so ``z`` is about standard normal for an honest
  completion, and large where a run of tokens is each a little unlikely (a stock phrase
  instead of work, symbols after the answer). It is an approximation: a few tokens'
  surprisal is skewed, so on short completions the upper tail is heavier (sampled from
  peaked distributions, ``z > 3.09`` in 0.2 to 0.25 % of 8- and 16-token completions,
  0.1 % of 32-token ones; ``tests/unit/test_token_test.py``).

:attr:`CompletionTest.p_value` joins the two (Bonferroni). Neither needs calibration data:
the null distribution is the receiver's own ``p`` (at the swarm's temperature). What breaks
the null: a different model (the test is for same-model peers), and the peer's drift from
the receiver's weights (each node trains on its own batches; ``bench/token_test.py`` and the
attack matrices' false positives measure how much). A nucleus below 1 makes it conservative.

Tried and not kept (issue 57): a test martingale of surprisal (Ville's inequality, valid
over every prefix at once), valid but weak: on bench/token_test.py's tuning set it caught
0.02 to 0.27 of the payloads where ``z`` caught 0.29 to 1.0; and a normal scan of the dyadic
prefixes and suffixes, which caught the trigger sentence more often (0.54 against 0.29) but,
on short spans' skewed surprisal, put 0.5 % of sampled completions under 1e-3 (5x the level).

Deliberately pure: it takes logits and token ids and knows nothing of views or verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

__all__ = ["STATS_CHUNK", "CompletionTest", "TokenStats", "completion_test", "token_stats"]


@dataclass(frozen=True, slots=True)
class TokenStats:
    """Per-token statistics of one completion under a policy (1-d tensors, one per token).

    Attributes:
        surprisal: ``-log p(x_t)``.
        entropy: the entropy of ``p`` at the position.
        variance: the variance of the surprisal under ``p`` at the position.
        tail: the probability of a token at most as likely as ``x_t``.
    """

    surprisal: torch.Tensor
    entropy: torch.Tensor
    variance: torch.Tensor
    tail: torch.Tensor


@dataclass(frozen=True, slots=True)
class CompletionTest:
    """The two tests of one completion (see the module docstring).

    Attributes:
        tokens: how many tokens were tested.
        p_min: Bonferroni p-value of its least likely token, ``min(1, n * min tail)``.
        z: surprisal excess over its expectation, in standard deviations.
    """

    tokens: int
    p_min: float
    z: float

    @property
    def p_value(self) -> float:
        """One p-value for "every token was sampled from this policy": the smaller of the
        token test's and the surprisal excess's (its standard normal tail), doubled."""
        excess = 0.5 * math.erfc(self.z / math.sqrt(2.0))
        return min(1.0, 2.0 * min(self.p_min, excess))


STATS_CHUNK = 64
"""Positions whose statistics :func:`token_stats` computes at once. Each takes several
float64 copies of its ``[positions, vocab]`` logits: at Qwen2.5's 151,936-token vocabulary
a 512-token completion at once was about 0.6 GB a copy and 3 GB in all; 64 positions bound
it to about 0.4 GB whatever the length (SmolLM2's 32-token completions are one chunk)."""


def token_stats(
    logits: torch.Tensor, tokens: torch.Tensor, *, chunk: int = STATS_CHUNK
) -> TokenStats:
    """The statistics of ``tokens`` (``[n]``) under ``logits`` (``[n, vocab]``, the logits
    that predict each token), computed in float64 (the tail is a sum over the vocabulary),
    ``chunk`` positions at a time (each position's figures are its own row's)."""
    if logits.shape[0] <= chunk:
        return _stats(logits, tokens)
    parts = [
        _stats(logits[a : a + chunk], tokens[a : a + chunk])
        for a in range(0, logits.shape[0], chunk)
    ]
    return TokenStats(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(TokenStats)))


def _stats(logits: torch.Tensor, tokens: torch.Tensor) -> TokenStats:
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    p = logp.exp()
    chosen = logp.gather(-1, tokens[:, None].to(logp.device)).squeeze(-1)
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    entropy = -plogp.sum(-1)
    second = torch.where(p > 0, p * logp * logp, torch.zeros_like(p)).sum(-1)
    tail = torch.where(logp <= chosen[:, None], p, torch.zeros_like(p)).sum(-1)
    return TokenStats(
        surprisal=-chosen,
        entropy=entropy,
        variance=(second - entropy * entropy).clamp_min(0.0),
        tail=tail.clamp(max=1.0),
    )


def completion_test(stats: TokenStats) -> CompletionTest:
    """Both tests of one completion's :func:`token_stats` (an empty one passes both)."""
    n = int(stats.surprisal.numel())
    if n == 0:
        return CompletionTest(tokens=0, p_min=1.0, z=0.0)
    p_min = min(1.0, n * float(stats.tail.min()))
    spread = math.sqrt(max(float(stats.variance.sum()), 1e-12))
    z = float((stats.surprisal - stats.entropy).sum()) / spread
    return CompletionTest(tokens=n, p_min=p_min, z=z)
