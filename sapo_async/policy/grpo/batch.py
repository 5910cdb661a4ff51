"""From scored groups to padded training tensors: which tokens are trained on, and how.

Owns the translation the trainer's docstring promises:

* a group's :class:`TokenSource` says whose token ids it carries: ``SAMPLED`` (the ids this
  node's own generator sampled) and ``RECEIVER`` (the ids this node made itself from an
  external completion's text: the round's candidate view, :mod:`sapo_async.node.view`)
  are trained on as they are, with the behaviour log-probs the group carries (for
  ``RECEIVER`` groups: the peer's, kept only where its ids equalled ours);
* a ``TEXT`` group (ids, if any, are a peer's claim) is trained on its *text*, tokenised
  by our tokenizer (plus EOS when it stopped), because the text is what our verifier
  scored: a peer's token ids are never trained on directly (poisoned ids could otherwise
  ride on a clean, rewarded text). A peer's behaviour log-probs are kept only when its ids
  equal that tokenisation exactly.

Also owns the trainer's input types (:class:`ScoredGroup`, :class:`ScoredCompletion`).
Deliberately does not know about models, optimizers or the loss; it needs only a tokenizer.

Invariants:
    * every row has at least one and at most ``max_completion_tokens`` completion tokens;
    * ``Batch.comp_mask[i, j]`` is 1 exactly where token ``j + 1`` of row ``i`` is a
      completion token (logits at position ``j`` predict token ``j + 1``);
    * a row's behaviour log-probs, when kept, have one entry per completion token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import torch

from sapo_async.policy.grpo.core import AdvantageMode, group_advantages
from sapo_async.wire import TaskRef

__all__ = [
    "INFORMATIVE_EPS",
    "Batch",
    "Batcher",
    "MiniBatch",
    "Row",
    "ScoredCompletion",
    "ScoredGroup",
    "TokenSource",
    "collate",
]

INFORMATIVE_EPS = 1e-9
"""Rewards closer than this count as equal (the group carries no gradient)."""


class TokenSource(StrEnum):
    """Whose token ids a :class:`ScoredGroup` carries (see the module docstring)."""

    SAMPLED = "sampled"
    """This node's generator sampled them: trained on as they are."""
    RECEIVER = "receiver"
    """This node tokenised the text itself (counted as re-tokenised): trained on as they are."""
    TEXT = "text"
    """A peer's claim, or none: the text is re-tokenised here."""


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
        producer: ``"local"`` or the producer's address (informational only: logs and
            reports; it decides nothing, whatever it is spelt).
        token_source: whose ids the completions carry, stated by whoever builds the group
            (keyword only, required: the node gives its own groups ``SAMPLED``, the
            round's external ones ``RECEIVER`` and scored wire groups ``TEXT``). It alone
            decides whether the ids are trusted and whether the group is :attr:`external`.
    """

    prompt: str
    completions: tuple[ScoredCompletion, ...]
    tokenizer_id: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    task: TaskRef | None = None
    producer: str = "local"
    token_source: TokenSource = field(kw_only=True)

    @property
    def external(self) -> bool:
        """Whether another node produced the completions: every source but ``SAMPLED``
        (the one that decides whether the ids are trusted, so a metric that counts
        external groups cannot disagree with what the batcher trusted)."""
        return self.token_source is not TokenSource.SAMPLED

    @property
    def rewards(self) -> list[float]:
        """The completions' rewards in order."""
        return [c.reward for c in self.completions]

    @property
    def informative(self) -> bool:
        """Whether the rewards differ (some advantage is non-zero)."""
        r = self.rewards
        return len(r) > 1 and max(r) - min(r) > INFORMATIVE_EPS


class Row(NamedTuple):
    """One training sequence before padding.

    Attributes:
        prompt: prompt token ids.
        completion: completion token ids (trained on).
        behaviour: per-completion-token log-probs under the generating policy, or ``None``.
        advantage: the sequence's group advantage.
    """

    prompt: list[int]
    completion: list[int]
    behaviour: list[float] | None
    advantage: float


@dataclass(slots=True)
class Batch:
    """Right-padded tensors of a list of rows, on the model's device.

    Attributes:
        ids: ``[B, W]`` prompt + completion token ids, padded.
        attn: ``[B, W]`` attention mask.
        comp_mask: ``[B, W-1]`` 1 where target token ``t + 1`` is a completion token.
        adv: ``[B]`` advantages.
        behaviour: ``[B, W-1]`` behaviour log-probs aligned with ``comp_mask``.
        has_behaviour: ``[B]`` bool, rows whose behaviour log-probs are known.
    """

    ids: torch.Tensor
    attn: torch.Tensor
    comp_mask: torch.Tensor
    adv: torch.Tensor
    behaviour: torch.Tensor
    has_behaviour: torch.Tensor


@dataclass(slots=True)
class Batcher:
    """Turns scored groups into rows and rows into padded batches for one tokenizer.

    Attributes:
        tokenizer: our tokenizer (EOS required).
        tokenizer_id: its digest (a group with another digest is text only to us).
        add_special_tokens: passed to the tokenizer when tokenising prompt text.
        advantage: the group advantage mode.
        max_completion_tokens: the most completion tokens trained on per sequence.
    """

    tokenizer: Any
    tokenizer_id: str
    add_special_tokens: bool
    advantage: AdvantageMode
    max_completion_tokens: int

    @property
    def eos(self) -> int:
        """Our EOS id, appended to a re-tokenised completion that stopped."""
        return int(self.tokenizer.eos_token_id)

    @property
    def pad(self) -> int:
        """The padding id (EOS when the tokenizer has no pad token)."""
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else self.eos

    def rows(self, groups: Sequence[ScoredGroup]) -> tuple[list[Row], int]:
        """One row per trainable completion of ``groups``, with its group advantage.

        Args:
            groups: the groups to train on.

        Returns:
            The rows (completions that tokenise to nothing are dropped) and how many
            completions were re-tokenised from text.

        Raises:
            ConfigError: a group has no completions or a non-finite reward.
        """
        rows: list[Row] = []
        retokenised = 0
        prompt_cache: dict[str, list[int]] = {}
        for group in groups:
            prompt = self._prompt_ids(group, prompt_cache)
            advantages = group_advantages(group.rewards, mode=self.advantage)
            for comp, adv in zip(group.completions, advantages, strict=True):
                ids, lps, retok = self._completion_ids(group, comp)
                retokenised += retok
                if not ids:
                    continue
                # A peer's text may re-tokenise to anything; never train past the cap
                # (it also bounds dr_grpo's constant normaliser).
                cap = self.max_completion_tokens
                if len(ids) > cap:
                    ids = ids[:cap]
                    lps = lps[:cap] if lps is not None else None
                rows.append(Row(prompt, ids, lps, adv))
        return rows, retokenised

    def _trusted(self, group: ScoredGroup) -> bool:
        """Whether the group's ids are this node's own (sampled or re-tokenised here)."""
        return group.tokenizer_id == self.tokenizer_id and group.token_source in (
            TokenSource.SAMPLED,
            TokenSource.RECEIVER,
        )

    def _prompt_ids(self, group: ScoredGroup, cache: dict[str, list[int]]) -> list[int]:
        """The group's own prompt ids when they are ours, else its text tokenised."""
        if self._trusted(group) and group.prompt_token_ids is not None:
            return list(group.prompt_token_ids)
        if group.prompt not in cache:
            enc = self.tokenizer(group.prompt, add_special_tokens=self.add_special_tokens)
            cache[group.prompt] = list(enc["input_ids"])
        return cache[group.prompt]

    def _completion_ids(
        self, group: ScoredGroup, comp: ScoredCompletion
    ) -> tuple[list[int], list[float] | None, int]:
        """The ids to train on, the behaviour log-probs kept, and 1 if re-tokenised."""
        if self._trusted(group) and comp.token_ids is not None:
            ids = list(comp.token_ids)
            lps = comp.behaviour_logprobs
            kept = list(lps) if lps and len(lps) == len(ids) else None
            # A RECEIVER completion was re-tokenised from text (by the round's view): it
            # counts as such whenever the peer's log-probs could not be kept.
            retok = int(group.token_source is TokenSource.RECEIVER and kept is None)
            return ids, kept, retok
        # A peer's token ids are never trained on directly: the text is what was scored,
        # so we train on the text's own tokenisation, and use the peer's log-probs only
        # when its ids are exactly that tokenisation (otherwise poisoned ids could ride on
        # a clean, rewarded text).
        ids = list(self.tokenizer(comp.text, add_special_tokens=False)["input_ids"])
        if comp.finish_reason == "stop":
            ids.append(self.eos)
        lps = comp.behaviour_logprobs
        if (
            group.tokenizer_id == self.tokenizer_id
            and comp.token_ids is not None
            and list(comp.token_ids) == ids
            and lps
            and len(lps) == len(ids)
        ):
            return ids, list(lps), 0
        return ids, None, 1

    def collate(self, rows: Sequence[Row], device: torch.device) -> Batch:
        """Pad ``rows`` on the right into one :class:`Batch` on ``device``."""
        return collate(rows, device, pad=self.pad)

    def minibatches(
        self,
        rows: Sequence[Row],
        k: int,
        device: torch.device,
        *,
        micro_batch_tokens: int | None = None,
    ) -> list[MiniBatch]:
        """Split ``rows`` in order into at most ``k`` near-equal minibatches (one optimizer
        step each), and each into micro-batches of at most ``micro_batch_tokens`` padded
        tokens (``None``: one micro-batch; a row longer than the budget goes alone)."""
        k = min(k, len(rows))
        size = math.ceil(len(rows) / k)
        out = []
        for i in range(0, len(rows), size):
            part = rows[i : i + size]
            out.append(
                MiniBatch(
                    micro=[self.collate(m, device) for m in _by_budget(part, micro_batch_tokens)],
                    sequences=len(part),
                    tokens=sum(len(r.completion) for r in part),
                )
            )
        return out


@dataclass(slots=True)
class MiniBatch:
    """The rows of one optimizer step, as micro-batches whose gradients accumulate.

    Attributes:
        micro: the micro-batches, in row order.
        sequences: rows in all of them (the loss's sequence count).
        tokens: completion tokens in all of them (the loss's token count).
    """

    micro: list[Batch]
    sequences: int
    tokens: int


def collate(rows: Sequence[Row], device: torch.device, *, pad: int) -> Batch:
    """Pad ``rows`` on the right with ``pad`` into one :class:`Batch` on ``device``."""
    width = max(len(r.prompt) + len(r.completion) for r in rows)
    n = len(rows)
    ids = torch.full((n, width), pad, dtype=torch.long)
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
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    return Batch(
        ids=ids.to(device),
        attn=attn.to(device),
        comp_mask=comp.to(device),
        adv=adv.to(device),
        behaviour=beh.to(device),
        has_behaviour=has.to(device),
    )


def _by_budget(rows: Sequence[Row], budget: int | None) -> list[Sequence[Row]]:
    """Consecutive runs of ``rows`` whose padded size (rows x longest) fits ``budget``."""
    if budget is None:
        return [rows]
    runs: list[Sequence[Row]] = []
    start, width = 0, 0
    for i, r in enumerate(rows):
        w = max(width, len(r.prompt) + len(r.completion))
        if i > start and w * (i - start + 1) > budget:
            runs.append(rows[start:i])
            start, w = i, len(r.prompt) + len(r.completion)
        width = w
    runs.append(rows[start:])
    return runs
