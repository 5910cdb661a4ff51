"""The GRPO trainer: scored groups in, one optimizer step (with metrics) out.

Owns the model's optimizer and the translation of scored groups into padded tensors:

* a *local* completion (``producer == "local"``, our ``tokenizer_id``) is trained on the
  token ids we sampled, with their behaviour log-probs;
* any other completion is trained on its *text*, tokenised by our tokenizer (plus EOS when
  it stopped), because the text is what our verifier scored: a peer's token ids are never
  trained on directly (poisoned ids could otherwise ride on a clean, rewarded text). A
  peer's behaviour log-probs are kept only when its ids equal that tokenisation exactly.

Deliberately does not know how groups were scored or sampled, or about NATS and the ledger.

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
from typing import Any

import torch

from sapo_async.errors import ConfigError, TrainingError
from sapo_async.logs import get_logger
from sapo_async.policy.grpo.core import (
    ADVANTAGE_MODES,
    AGGREGATIONS,
    AdvantageMode,
    Aggregation,
    group_advantages,
    policy_loss,
    truncated_is_weights,
)
from sapo_async.policy.models.tokenizer import tokenizer_id as _tokenizer_id
from sapo_async.wire import TaskRef

__all__ = [
    "INFORMATIVE_EPS",
    "ScoredCompletion",
    "ScoredGroup",
    "StepMetrics",
    "Trainer",
    "TrainerConfig",
]


_log = get_logger("sapo_async.policy.grpo")

INFORMATIVE_EPS = 1e-9
"""Rewards closer than this count as equal (the group carries no gradient)."""


@dataclass(frozen=True, slots=True)
class ScoredCompletion:
    """One completion with the reward *this* node's verifier gave it.

    Attributes:
        text: the completion text.
        reward: the reward.
        finish_reason: ``"stop"`` or ``"length"`` (decides whether EOS is appended when
            re-tokenising text).
        token_ids: ids under the producer's tokenizer (used only when it is ours).
        behaviour_logprobs: per-token log-probs under the generating policy (same length).
    """

    text: str
    reward: float
    finish_reason: str = "stop"
    token_ids: tuple[int, ...] | None = None
    behaviour_logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class ScoredGroup:
    """A question's completions, scored.

    Attributes:
        prompt: the prompt text the completions answer.
        completions: the scored completions.
        tokenizer_id: digest of the producer's tokenizer (``None``: text only).
        prompt_token_ids: prompt ids under that tokenizer (optional).
        task: where the question came from (informational).
        producer: ``"local"`` or the producer's address (informational, for metrics).
    """

    prompt: str
    completions: tuple[ScoredCompletion, ...]
    tokenizer_id: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    task: TaskRef | None = None
    producer: str = "local"

    @property
    def rewards(self) -> list[float]:
        """The completions' rewards in order."""
        return [c.reward for c in self.completions]

    @property
    def informative(self) -> bool:
        """Whether the rewards differ (some advantage is non-zero)."""
        r = self.rewards
        return len(r) > 1 and max(r) - min(r) > INFORMATIVE_EPS


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """GRPO and optimizer settings.

    Attributes:
        lr: AdamW learning rate (3e-5 suits the tiny model's sparse regime; real models
            want ~1e-6).
        weight_decay: AdamW weight decay (0: RL steps are few and small).
        betas: AdamW betas.
        max_grad_norm: gradient clipping threshold (<= 0 disables).
        advantage: ``"std"`` or ``"mean"``.
        aggregation: ``"grpo"``, ``"dapo"`` or ``"dr_grpo"``.
        eps_low: lower clip epsilon.
        eps_high: upper clip epsilon.
        beta: k3 KL coefficient to a frozen copy of the initial model (0: no reference
            kept).
        tis_cap: cap of truncated importance weights from behaviour log-probs (None: off).
        ppo_epochs: passes over the batch per step.
        minibatches: optimizer steps per epoch (the batch is split by sequences).
        max_completion_tokens: ``dr_grpo``'s constant normaliser, and the most completion
            tokens trained on per sequence (longer completions are truncated).
        drop_uninformative: drop all-equal-reward groups before the step.
        skip_empty: skip the optimizer step when no group is informative.
    """

    lr: float = 3e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    advantage: AdvantageMode = "std"
    aggregation: Aggregation = "dapo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0
    tis_cap: float | None = None
    ppo_epochs: int = 1
    minibatches: int = 1
    max_completion_tokens: int = 64
    drop_uninformative: bool = True
    skip_empty: bool = True

    def validate(self) -> None:
        """Check every field.

        Raises:
            ConfigError: a field out of range (named).
        """
        checks: list[tuple[bool, str, str]] = [
            (self.lr > 0, "lr", f"must be > 0, got {self.lr}"),
            (self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}"),
            (self.advantage in ADVANTAGE_MODES, "advantage", f"must be in {ADVANTAGE_MODES}"),
            (self.aggregation in AGGREGATIONS, "aggregation", f"must be in {AGGREGATIONS}"),
            (self.eps_low >= 0 and self.eps_high >= 0, "eps_low", "clip epsilons must be >= 0"),
            (self.beta >= 0, "beta", f"must be >= 0, got {self.beta}"),
            (self.tis_cap is None or self.tis_cap > 0, "tis_cap", "must be > 0 or None"),
            (self.ppo_epochs >= 1, "ppo_epochs", f"must be >= 1, got {self.ppo_epochs}"),
            (self.minibatches >= 1, "minibatches", f"must be >= 1, got {self.minibatches}"),
            (self.max_completion_tokens >= 1, "max_completion_tokens", "must be >= 1"),
        ]
        for ok, name, msg in checks:
            if not ok:
                raise ConfigError(f"trainer.{name} {msg}", field=f"trainer.{name}")


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
        external_groups: given groups whose producer is not ``"local"``.
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


@dataclass(slots=True)
class _Batch:
    ids: torch.Tensor  # [B, W] right-padded prompt + completion
    attn: torch.Tensor  # [B, W]
    comp_mask: torch.Tensor  # [B, W-1] 1 where target token t+1 is a completion token
    adv: torch.Tensor  # [B]
    behaviour: torch.Tensor  # [B, W-1] behaviour log-probs aligned with comp_mask
    has_behaviour: torch.Tensor  # [B] bool


class Trainer:
    """GRPO on the caller's causal LM.

    Args:
        model: the transformers causal LM to train in place.
        tokenizer: its tokenizer (EOS required).
        config: settings (validated here).
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
        self.config.validate()
        if tokenizer.eos_token_id is None:
            raise ConfigError("the tokenizer has no EOS token", field="model.tokenizer")
        self.model = model
        self.tokenizer = tokenizer
        self.tokenizer_id = _tokenizer_id(tokenizer)
        self._add_special = add_special_tokens
        self._eos = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self._pad = int(pad) if pad is not None else self._eos
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=self.config.lr,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )
        self.policy_version = 0
        self._ref: Any = None
        if self.config.beta > 0:
            self._ref = copy.deepcopy(model).eval()
            for p in self._ref.parameters():
                p.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        device: torch.device = next(self.model.parameters()).device
        return device

    # -- tensors -------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _rows(
        self, groups: Sequence[ScoredGroup]
    ) -> tuple[list[tuple[list[int], list[int], list[float] | None, float]], int]:
        rows: list[tuple[list[int], list[int], list[float] | None, float]] = []
        retok = 0
        prompt_cache: dict[str, list[int]] = {}
        for group in groups:
            ours = group.tokenizer_id == self.tokenizer_id
            local = group.producer == "local"
            if ours and local and group.prompt_token_ids is not None:
                prompt = list(group.prompt_token_ids)
            else:
                if group.prompt not in prompt_cache:
                    enc = self.tokenizer(group.prompt, add_special_tokens=self._add_special)
                    prompt_cache[group.prompt] = list(enc["input_ids"])
                prompt = prompt_cache[group.prompt]
            advs = group_advantages(group.rewards, mode=self.config.advantage)
            for comp, adv in zip(group.completions, advs, strict=True):
                lps: list[float] | None = None
                if ours and local and comp.token_ids is not None:
                    ids = list(comp.token_ids)
                    if comp.behaviour_logprobs and len(comp.behaviour_logprobs) == len(ids):
                        lps = list(comp.behaviour_logprobs)
                else:
                    # A peer's token ids are never trained on directly: the text is what
                    # was scored, so we train on the text's own tokenisation, and use the
                    # peer's log-probs only when its ids are exactly that tokenisation
                    # (otherwise poisoned ids could ride on a clean, rewarded text).
                    ids = self._encode(comp.text)
                    if comp.finish_reason == "stop":
                        ids.append(self._eos)
                    if (
                        ours
                        and comp.token_ids is not None
                        and list(comp.token_ids) == ids
                        and comp.behaviour_logprobs
                        and len(comp.behaviour_logprobs) == len(ids)
                    ):
                        lps = list(comp.behaviour_logprobs)
                    else:
                        retok += 1
                if not ids:
                    continue
                # A peer's text may re-tokenise to anything; never train past the cap
                # (it also bounds dr_grpo's constant normaliser).
                cap = self.config.max_completion_tokens
                if len(ids) > cap:
                    ids = ids[:cap]
                    lps = lps[:cap] if lps is not None else None
                rows.append((prompt, ids, lps, adv))
        return rows, retok

    def _collate(
        self, rows: Sequence[tuple[list[int], list[int], list[float] | None, float]]
    ) -> _Batch:
        width = max(len(p) + len(c) for p, c, _, _ in rows)
        n = len(rows)
        ids = torch.full((n, width), self._pad, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        comp = torch.zeros((n, width - 1), dtype=torch.float32)
        beh = torch.zeros((n, width - 1), dtype=torch.float32)
        has = torch.zeros(n, dtype=torch.bool)
        for i, (p, c, lps, _) in enumerate(rows):
            total = len(p) + len(c)
            ids[i, :total] = torch.tensor(p + c, dtype=torch.long)
            attn[i, :total] = 1
            # logits at position j predict token j + 1: completion tokens are at
            # positions len(p) .. total-1, predicted from len(p)-1 .. total-2.
            comp[i, len(p) - 1 : total - 1] = 1.0
            if lps is not None:
                beh[i, len(p) - 1 : total - 1] = torch.tensor(lps, dtype=torch.float32)
                has[i] = True
        adv = torch.tensor([a for _, _, _, a in rows], dtype=torch.float32)
        dev = self.device
        return _Batch(
            ids=ids.to(dev),
            attn=attn.to(dev),
            comp_mask=comp.to(dev),
            adv=adv.to(dev),
            behaviour=beh.to(dev),
            has_behaviour=has.to(dev),
        )

    def _logp(self, model: Any, batch: _Batch, *, entropy: bool) -> tuple[torch.Tensor, float]:
        logits = model(input_ids=batch.ids, attention_mask=batch.attn).logits[:, :-1].float()
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
        ent = 0.0
        if entropy:
            with torch.no_grad():
                h = -(logp_all.exp() * logp_all).sum(-1)
                ent = float((h * batch.comp_mask).sum() / batch.comp_mask.sum().clamp_min(1.0))
        return logp, ent

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
        cfg = self.config
        rewards = [r for g in groups for r in g.rewards]
        if any(not g.completions for g in groups):
            raise ConfigError("a scored group has no completions", field="groups")
        n_r = max(len(rewards), 1)
        mean = sum(rewards) / n_r
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n_r)
        zero_std = sum(not g.informative for g in groups)
        base = {
            "reward_mean": mean,
            "reward_std": std,
            "zero_std_fraction": zero_std / max(len(groups), 1),
            "groups": len(groups),
            "external_groups": sum(g.producer != "local" for g in groups),
        }
        used = [g for g in groups if g.informative] if cfg.drop_uninformative else list(groups)
        rows, retok = self._rows(used)
        if (not any(g.informative for g in used) and cfg.skip_empty) or not rows:
            _log.debug("grpo_step_skipped", policy_version=self.policy_version, **base)
            return StepMetrics(
                **base,  # type: ignore[arg-type]
                groups_used=0,
                sequences=0,
                tokens=0,
                skipped=True,
                retokenised=retok,
                policy_version=self.policy_version,
                seconds=time.perf_counter() - t0,
            )
        self.model.train()
        batches = self._minibatches(rows)
        reuse_logp = cfg.ppo_epochs == 1 and cfg.minibatches == 1
        olds: list[torch.Tensor | None] = []
        refs: list[torch.Tensor | None] = []
        with torch.no_grad():
            for b in batches:
                olds.append(None if reuse_logp else self._logp(self.model, b, entropy=False)[0])
                refs.append(self._logp(self._ref, b, entropy=False)[0] if self._ref else None)
        losses, clips, ents, kls, norms = [], [], [], [], []
        for _ in range(cfg.ppo_epochs):
            for b, old, ref in zip(batches, olds, refs, strict=True):
                logp, ent = self._logp(self.model, b, entropy=True)
                old_logp = logp.detach() if old is None else old
                weights = None
                if cfg.tis_cap is not None and bool(b.has_behaviour.any()):
                    weights = truncated_is_weights(
                        old_logp, b.behaviour, b.has_behaviour, cfg.tis_cap
                    )
                terms = policy_loss(
                    logp,
                    old_logp,
                    b.adv,
                    b.comp_mask,
                    aggregation=cfg.aggregation,
                    eps_low=cfg.eps_low,
                    eps_high=cfg.eps_high,
                    beta=cfg.beta,
                    ref_logp=ref,
                    is_weights=weights,
                    max_tokens=cfg.max_completion_tokens,
                )
                if not torch.isfinite(terms.loss):
                    raise TrainingError(f"non-finite loss {float(terms.loss)}")
                self.optimizer.zero_grad(set_to_none=True)
                terms.loss.backward()  # type: ignore[no-untyped-call]
                norm = self._clip()
                if not math.isfinite(norm):
                    self.optimizer.zero_grad(set_to_none=True)
                    raise TrainingError(f"non-finite gradient norm {norm}")
                self.optimizer.step()
                self.policy_version += 1
                losses.append(float(terms.loss.detach()))
                clips.append(terms.clip_fraction)
                ents.append(ent)
                kls.append(terms.kl)
                norms.append(norm)
        self.optimizer.zero_grad(set_to_none=True)

        def avg(xs: list[float]) -> float:
            return sum(xs) / len(xs)

        metrics = StepMetrics(
            **base,  # type: ignore[arg-type]
            groups_used=len(used),
            sequences=len(rows),
            tokens=sum(len(c) for _, c, _, _ in rows),
            skipped=False,
            loss=avg(losses),
            clip_fraction=avg(clips),
            entropy=avg(ents),
            kl=avg(kls),
            grad_norm=avg(norms),
            retokenised=retok,
            policy_version=self.policy_version,
            seconds=time.perf_counter() - t0,
        )
        # debug level: a CPU swarm takes thousands of steps; the CLI keeps a JSONL log
        _log.debug(
            "grpo_stepped",
            policy_version=self.policy_version,
            reward_mean=metrics.reward_mean,
            reward_std=metrics.reward_std,
            zero_std_fraction=metrics.zero_std_fraction,
            clip_fraction=metrics.clip_fraction,
            entropy=metrics.entropy,
            kl=metrics.kl,
            grad_norm=metrics.grad_norm,
        )
        return metrics

    def _minibatches(
        self, rows: list[tuple[list[int], list[int], list[float] | None, float]]
    ) -> list[_Batch]:
        k = min(self.config.minibatches, len(rows))
        size = math.ceil(len(rows) / k)
        return [self._collate(rows[i : i + size]) for i in range(0, len(rows), size)]

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
