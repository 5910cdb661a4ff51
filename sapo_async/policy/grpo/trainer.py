"""The GRPO trainer: scored groups in, one optimizer step (with metrics) out.

Owns the model's optimizer and the update loop. One :meth:`Trainer.step` reads as::

    given    = reward statistics of every group             (_GivenGroups.of)
    rows     = informative groups -> (prompt, completion, behaviour, A_i)   (batch.Batcher)
    old, ref = log pi_old, log pi_ref of each minibatch     (_frozen_logprobs)
    for epoch, minibatch:                                   (_update)
        for micro-batch (gradients accumulate):
            logp = log pi_theta(completion tokens)          (logprobs.token_logprobs)
            loss = clipped surrogate x truncated IS + beta k3   (_loss -> core.policy_loss)
        theta <- AdamW(theta, clip(grad loss, max_grad_norm))

Which tokens a completion is trained on (our sampled ids, or a peer's text re-tokenised)
is :mod:`.batch`'s business; the maths is :mod:`.core`'s. Deliberately does not know how
groups were scored or sampled, or about NATS and the ledger.

Policy on uninformative groups (docs/learning.md, "Uninformative batches"): a group whose
rewards are all equal has all-zero advantages and contributes no policy gradient. Such
groups are dropped before the step (as DAPO's dynamic sampling does), so they neither cost
compute nor dilute the token-mean normaliser; when *no* group is informative the step is
skipped entirely (``skip_empty=True``, the default): no optimizer step, so AdamW's momentum
and weight decay do not move the weights on zero gradient, and the policy version does not
advance. ``skip_empty=False`` steps anyway (the other baseline the notes measured).

Invariants:
    * ``policy_version`` counts optimizer steps actually taken;
    * the model is the caller's module, updated in place (a CPU generator sharing it sees
      every step immediately).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from sapo_async.errors import ConfigError, TrainingError
from sapo_async.limits import FAST_PATH_MIN_PARAMS
from sapo_async.logs import get_logger
from sapo_async.policy.digest import tokenizer_id as _tokenizer_id
from sapo_async.policy.grpo.batch import (
    INFORMATIVE_EPS,
    Batch,
    Batcher,
    MiniBatch,
    ScoredCompletion,
    ScoredGroup,
)
from sapo_async.policy.grpo.config import TrainerConfig
from sapo_async.policy.grpo.core import (
    LossTerms,
    policy_loss,
    truncated_is_weights,
)
from sapo_async.policy.grpo.logprobs import (
    bf16_autocast,
    bf16_supported,
    enable_activation_checkpointing,
    token_logprobs,
)

__all__ = [
    "INFORMATIVE_EPS",
    "STAGES",
    "ScoredCompletion",
    "ScoredGroup",
    "StepMetrics",
    "Trainer",
    "TrainerConfig",
]


_log = get_logger("sapo_async.policy.grpo")

STAGES = ("batch", "old_logprobs", "forward", "backward", "optimizer")
"""The stages of a step :attr:`Trainer.stage_seconds` times: rows and padded tensors, the
frozen (old and reference) log-probs, the forward with the loss, the backward, and gradient
clipping with the optimizer step (summed over micro-batches, minibatches and epochs)."""


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """What one :meth:`Trainer.step` did.

    Attributes:
        reward_mean: mean reward over every completion given (informative or not).
        reward_std: population std of those rewards.
        zero_std_fraction: fraction of given groups whose rewards were all equal.
        groups: groups given; ``groups_used``: groups trained on.
        sequences: completions trained on; ``tokens``: completion tokens trained on.
        skipped: the optimizer step was skipped (no informative group).
        loss, clip_fraction, entropy, kl, grad_norm: means over the step's minibatches
            (0 when skipped); ``grad_norm`` is before clipping.
        external_groups: given groups another node produced (:attr:`ScoredGroup.external`:
            decided by the group's ``token_source``, not by its ``producer`` string).
        retokenised: completions re-tokenised from text.
        policy_version: optimizer steps taken after this call.
        seconds: wall time of the call.
    """

    reward_mean: float
    reward_std: float
    zero_std_fraction: float
    groups: int
    groups_used: int
    sequences: int
    tokens: int
    skipped: bool
    loss: float = 0.0
    clip_fraction: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0
    external_groups: int = 0
    retokenised: int = 0
    policy_version: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Trainer:
    """GRPO on the caller's causal LM.

    Args:
        model: the transformers causal LM to train in place.
        tokenizer: its tokenizer (EOS required).
        config: settings (validated when built).
        add_special_tokens: passed to the tokenizer when re-tokenising prompt text
            (``False`` when prompts are already chat-templated, as for the generator).

    Raises:
        ConfigError: invalid settings or a tokenizer without EOS.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: TrainerConfig | None = None,
        *,
        add_special_tokens: bool = True,
    ) -> None:
        self.config = config or TrainerConfig()
        if tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer has no EOS token", field="model.tokenizer")
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer_id = _tokenizer_id(tokenizer)
        self._batcher = Batcher(
            tokenizer=tokenizer,
            tokenizer_id=self.tokenizer_id,
            add_special_tokens=add_special_tokens,
            advantage=self.config.advantage,
            max_completion_tokens=self.config.max_completion_tokens,
        )
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.config.lr,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )
        if self.config.gradient_checkpointing:
            enable_activation_checkpointing(model)
        self._large = sum(p.numel() for p in model.parameters()) >= FAST_PATH_MIN_PARAMS
        self._bf16_fast = bf16_supported(self.device)
        if self.config.bf16 is True and not self._bf16_fast:
            why = " (no avx512_bf16 or amx_bf16 on this CPU)" if self.device.type == "cpu" else ""
            raise ConfigError(
                f"trainer.bf16 is not supported on {self.device}{why}", field="trainer.bf16"
            )
        self.policy_version = 0
        self.stage_seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        """Wall time of each stage of the last :meth:`step` (:data:`STAGES`; a profile:
        ``bench/real_profile.py`` reads it)."""
        self._ref: Any = None
        if self.config.kl_beta > 0:
            self._ref = copy.deepcopy(model).eval()
            for p in self._ref.parameters():
                p.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        device: torch.device = next(self.model.parameters()).device
        return device

    # -- the step ------------------------------------------------------------------

    def step(self, groups: Sequence[ScoredGroup]) -> StepMetrics:
        """Take one GRPO update (``ppo_epochs`` x ``minibatches`` optimizer steps) on
        ``groups``.

        Args:
            groups: scored groups, local and external, in any mix.

        Returns:
            The step's metrics (``skipped`` when no group was informative and
            ``skip_empty`` is set).

        Raises:
            ConfigError: a group has no completions or a non-finite reward.
            TrainingError: the loss or gradient became non-finite.
        """
        t0 = time.perf_counter()
        self.stage_seconds = dict.fromkeys(STAGES, 0.0)
        cfg = self.config
        if any(not g.completions for g in groups):
            raise ConfigError("a scored group has no completions", field="groups")
        given = _GivenGroups.of(groups)
        used = [g for g in groups if g.informative] if cfg.drop_uninformative else list(groups)
        rows, retokenised = self._batcher.rows(used)
        if (not any(g.informative for g in used) and cfg.skip_empty) or not rows:
            _log.debug("grpo_step_skipped", policy_version=self.policy_version, **given._asdict())
            return given.metrics(
                groups_used=0,
                sequences=0,
                tokens=0,
                skipped=True,
                retokenised=retokenised,
                policy_version=self.policy_version,
                seconds=time.perf_counter() - t0,
            )
        self.model.train()
        batches = self._batcher.minibatches(
            rows, cfg.minibatches, self.device, micro_batch_tokens=cfg.micro_batch_tokens
        )
        self.stage_seconds["batch"] = time.perf_counter() - t0
        olds, refs = self._frozen_logprobs(batches)
        updates = [
            self._update(batch, old, ref)
            for _ in range(cfg.ppo_epochs)
            for batch, old, ref in zip(batches, olds, refs, strict=True)
        ]
        self.optimizer.zero_grad(set_to_none=True)
        metrics = given.metrics(
            groups_used=len(used),
            sequences=len(rows),
            tokens=sum(len(r.completion) for r in rows),
            skipped=False,
            **_Update.mean(updates),
            retokenised=retokenised,
            policy_version=self.policy_version,
            seconds=time.perf_counter() - t0,
        )
        _log_stepped(metrics)
        return metrics

    def _frozen_logprobs(self, batches: Sequence[MiniBatch]) -> tuple[list[_Frozen], list[_Frozen]]:
        """``old_logp`` and ``ref_logp`` of each micro-batch, before any update of this step.

        ``old`` is ``None`` when there is a single update (one epoch, one minibatch): the
        policy then has not moved yet, so the update's own detached log-probs serve and a
        forward pass is saved. ``ref`` is ``None`` without a KL reference.
        """
        reuse = self.config.ppo_epochs == 1 and self.config.minibatches == 1
        if reuse and self._ref is None:  # no pass to run (nor to time)
            return [[None] * len(mb.micro) for mb in batches], [
                [None] * len(mb.micro) for mb in batches
            ]
        t0 = time.perf_counter()
        olds: list[_Frozen] = []
        refs: list[_Frozen] = []
        with torch.no_grad(), self._autocast():
            for mb in batches:
                olds.append([None if reuse else self._logprobs(self.model, b)[0] for b in mb.micro])
                refs.append(
                    [self._logprobs(self._ref, b)[0] if self._ref else None for b in mb.micro]
                )
        self.stage_seconds["old_logprobs"] = time.perf_counter() - t0
        return olds, refs

    def _update(self, mb: MiniBatch, olds: _Frozen, refs: _Frozen) -> _Update:
        """One optimizer step on ``mb``: the clipped surrogate of each micro-batch,
        backward (gradients accumulate), clip, AdamW."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = clip = entropy = kl = 0.0
        for batch, old, ref in zip(mb.micro, olds, refs, strict=True):
            t0 = time.perf_counter()
            with self._autocast():
                logp, ent = self._logprobs(self.model, batch, entropy=True)
            terms = self._loss(batch, mb, logp, logp.detach() if old is None else old, ref)
            if not torch.isfinite(terms.loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingError(f"non-finite loss {float(terms.loss)}")
            t1 = time.perf_counter()
            terms.loss.backward()  # type: ignore[no-untyped-call]
            self.stage_seconds["forward"] += t1 - t0
            self.stage_seconds["backward"] += time.perf_counter() - t1
            loss += float(terms.loss.detach())
            clip += terms.clip_fraction
            kl += terms.kl
            entropy += ent / max(mb.tokens, 1)
        t0 = time.perf_counter()
        norm = self._clip()
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(f"non-finite gradient norm {norm}")
        self.optimizer.step()
        self.stage_seconds["optimizer"] += time.perf_counter() - t0
        self.policy_version += 1
        return _Update(loss, clip, entropy, kl, norm)

    def _logprobs(
        self, model: Any, batch: Batch, *, entropy: bool = False
    ) -> tuple[torch.Tensor, float]:
        return token_logprobs(
            model,
            batch,
            entropy=entropy,
            chunk_tokens=self.config.logprob_chunk_tokens,
            share_prompts=self.share_prompts,
        )

    @property
    def bf16(self) -> bool:
        """Whether the step runs under bf16 autocast (``trainer.bf16``, "auto" resolved:
        a model of :data:`~sapo_async.limits.FAST_PATH_MIN_PARAMS` or more where bf16 is
        fast)."""
        asked = self.config.bf16
        return self._large and self._bf16_fast if asked == "auto" else asked

    @property
    def share_prompts(self) -> bool:
        """Whether each distinct prompt runs once (``trainer.share_prompts``, "auto"
        resolved: a model of :data:`~sapo_async.limits.FAST_PATH_MIN_PARAMS` or more)."""
        asked = self.config.share_prompts
        return self._large if asked == "auto" else asked

    def _autocast(self) -> Any:
        return bf16_autocast(self.device, enabled=self.bf16)

    def _loss(
        self,
        batch: Batch,
        mb: MiniBatch,
        logp: torch.Tensor,
        old: torch.Tensor,
        ref: torch.Tensor | None,
    ) -> LossTerms:
        """The GRPO loss of micro-batch ``batch`` as its share of minibatch ``mb``'s
        (:func:`~.core.policy_loss`), with truncated IS weights where behaviour log-probs
        are known."""
        cfg = self.config
        weights = None
        if cfg.tis_cap is not None and bool(batch.has_behaviour.any()):
            weights = truncated_is_weights(
                old,
                batch.behaviour,
                batch.has_behaviour,
                cfg.tis_cap,
                level=cfg.tis_level,
                mask=batch.comp_mask,
            )
        return policy_loss(
            logp,
            old,
            batch.adv,
            batch.comp_mask,
            aggregation=cfg.loss_type,
            eps_low=cfg.clip_low,
            eps_high=cfg.clip_high,
            beta=cfg.kl_beta,
            ref_logp=ref,
            is_weights=weights,
            max_tokens=cfg.max_completion_tokens,
            n_sequences=mb.sequences,
            n_tokens=float(mb.tokens),
        )

    def _clip(self) -> float:
        """Clip the gradient to ``max_grad_norm``; returns its norm before clipping."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def _log_stepped(metrics: StepMetrics) -> None:
    # debug level: a CPU swarm takes thousands of steps; the CLI keeps a JSONL log
    _log.debug(
        "grpo_stepped",
        policy_version=metrics.policy_version,
        reward_mean=metrics.reward_mean,
        reward_std=metrics.reward_std,
        zero_std_fraction=metrics.zero_std_fraction,
        clip_fraction=metrics.clip_fraction,
        entropy=metrics.entropy,
        kl=metrics.kl,
        grad_norm=metrics.grad_norm,
    )


_Frozen = list[torch.Tensor | None]
"""Frozen log-probs of one minibatch, one entry per micro-batch."""


class _Update(NamedTuple):
    """What one optimizer step measured (``grad_norm`` before clipping)."""

    loss: float
    clip_fraction: float
    entropy: float
    kl: float
    grad_norm: float

    @staticmethod
    def mean(updates: Sequence[_Update]) -> dict[str, float]:
        """Each field's mean over ``updates`` (one per optimizer step)."""
        return {
            name: sum(getattr(u, name) for u in updates) / len(updates) for name in _Update._fields
        }


class _GivenGroups(NamedTuple):
    """Reward statistics of every group given to a step, informative or not."""

    reward_mean: float
    reward_std: float
    zero_std_fraction: float
    groups: int
    external_groups: int

    @classmethod
    def of(cls, groups: Sequence[ScoredGroup]) -> _GivenGroups:
        """Mean and population std of all rewards, and the share of all-equal groups."""
        rewards = [r for g in groups for r in g.rewards]
        n = max(len(rewards), 1)
        mean = sum(rewards) / n
        return cls(
            reward_mean=mean,
            reward_std=math.sqrt(sum((r - mean) ** 2 for r in rewards) / n),
            zero_std_fraction=sum(not g.informative for g in groups) / max(len(groups), 1),
            groups=len(groups),
            external_groups=sum(g.external for g in groups),
        )

    def metrics(self, **step: Any) -> StepMetrics:
        """These statistics plus what the step did (``StepMetrics``'s other fields)."""
        return StepMetrics(**self._asdict(), **step)
