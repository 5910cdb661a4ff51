"""A node's groups, in pure pieces: generate, put on the wire, score any group.

Owns the glue between tasks, a generator and the verifier for ONE node's groups:

* :func:`generate_groups`: B task items -> B x L completions (a :class:`GeneratedGroup`
  each);
* :func:`to_rollout_group`: a generated group -> the wire :class:`RolloutGroup`;
* :func:`score_generated` / :func:`score_rollout_group`: any group, local or external,
  scored by *this* node's verifier (an external group's task is re-derived from its
  TaskRef and config and checked against the question and answer it claims);
* :func:`round_seed`: the seed of a (swarm seed, node, round, stream).

Deliberately does not know about NATS, signing, the ledger or the trainer.

Common random numbers: the questions of (swarm seed, node, round) come from
:class:`~sapo_async.tasks.TaskSource`, and the sampling seed from :func:`round_seed`, so two
runs that differ only in configuration see the same questions and the same random stream.
Departure from the paper: a receiver prompts its model with *its own* formatting of the
re-derived question (``RolloutGroup.question`` is reasoning-gym's question text, which is
what receivers verify), not with the producer's prompt string.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sapo_async.errors import RejectedInput
from sapo_async.policy.generation.base import GenerationResult, Generator
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.policy.grpo.trainer import ScoredCompletion, ScoredGroup
from sapo_async.tasks import (
    PromptStyle,
    TaskItem,
    Verifier,
    apply_chat_template,
    derive,
    format_prompt,
)
from sapo_async.wire import SCHEMA_VERSION, Completion, RolloutGroup, SamplingParams

__all__ = [
    "GeneratedGroup",
    "SharedRound",
    "build_prompt",
    "derive_group_task",
    "generate_groups",
    "round_seed",
    "score_generated",
    "score_rollout_group",
    "to_rollout_group",
]


def round_seed(swarm_seed: int, node: int, round_: int, stream: str = "sample") -> int:
    """A 63-bit seed that is a pure function of (swarm seed, node, round, stream)."""
    key = f"sapo:{stream}:{swarm_seed}:{node}:{round_}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


@dataclass(frozen=True, slots=True)
class GeneratedGroup:
    """One task item with the L completions this node sampled for it.

    Attributes:
        item: the task item.
        prompt: the exact prompt text given to the generator.
        result: the generator's result (texts, token ids, log-probs, finish reasons).
        sampling: the sampling parameters used.
    """

    item: TaskItem
    prompt: str
    result: GenerationResult
    sampling: SamplingParams


@dataclass(frozen=True, slots=True)
class SharedRound:
    """The first half of a round: generated, published and scored, not yet trained.

    Attributes:
        round: the round index.
        generated: the node's own groups.
        local: the same, scored by the node's verifier.
        hashes: rollout hashes of the groups that were acknowledged.
        policy_version: the version the groups were generated with.
        generate_s / publish_s / score_s: phase times.
    """

    round: int
    generated: list[GeneratedGroup]
    local: list[ScoredGroup]
    hashes: list[bytes]
    policy_version: int
    generate_s: float
    publish_s: float
    score_s: float


def build_prompt(item: TaskItem, style: PromptStyle, chat_tokenizer: Any = None) -> str:
    """The prompt for ``item``: ``format_prompt`` in ``style``, chat-templated when a
    tokenizer with a chat template is given."""
    text = format_prompt(item, style)
    return apply_chat_template(chat_tokenizer, text) if chat_tokenizer is not None else text


async def generate_groups(
    generator: Generator,
    items: Sequence[TaskItem],
    sampling: SamplingParams,
    *,
    n: int,
    seed: int | None,
    prompt_style: PromptStyle = "compact",
    chat_tokenizer: Any = None,
) -> list[GeneratedGroup]:
    """Sample ``n`` completions for each item in one generator call.

    Args:
        generator: any :class:`~sapo_async.policy.generation.base.Generator`.
        items: the questions.
        sampling: sampling parameters.
        n: completions per question (L).
        seed: sampling seed (see :func:`round_seed`).
        prompt_style: how questions are shown.
        chat_tokenizer: apply this tokenizer's chat template to prompts (real chat models).

    Returns:
        One group per item, in order.

    Raises:
        GenerationError: the generator failed.
    """
    prompts = [build_prompt(it, prompt_style, chat_tokenizer) for it in items]
    results = await generator.generate(prompts, sampling, n=n, seed=seed)
    return [
        GeneratedGroup(item=it, prompt=p, result=r, sampling=sampling)
        for it, p, r in zip(items, prompts, results, strict=True)
    ]


def to_rollout_group(
    group: GeneratedGroup,
    *,
    swarm: str,
    producer: str,
    producer_round: int,
    policy_version: int,
    model_id: str,
    tokenizer_id: str,
    created_at_ms: int | None = None,
    include_tokens: bool = True,
) -> RolloutGroup:
    """The wire form of a generated group (question = reasoning-gym's question text).

    Args:
        include_tokens: keep token ids and log-probs (drop them to shrink messages).
    """
    comps = group.result.completions
    if not include_tokens:
        comps = tuple(type(c)(text=c.text, finish_reason=c.finish_reason) for c in comps)
    return RolloutGroup(
        schema_version=SCHEMA_VERSION,
        swarm=swarm,
        producer=producer,
        producer_round=producer_round,
        policy_version=policy_version,
        model_id=model_id,
        tokenizer_id=tokenizer_id,
        task=group.item.ref,
        task_config=group.item.config_json,
        question=group.item.question,
        answer=group.item.answer,
        completions=comps,
        sampling=group.sampling,
        created_at_ms=int(time.time() * 1000) if created_at_ms is None else created_at_ms,
    )


def score_generated(
    groups: Sequence[GeneratedGroup], verifier: Verifier, *, tokenizer_id: str
) -> list[ScoredGroup]:
    """Score this node's own groups (token ids and log-probs kept for training).

    Args:
        groups: groups from :func:`generate_groups`.
        verifier: this node's verifier.
        tokenizer_id: the generator's tokenizer digest (marks the token ids as ours).
    """
    return [
        ScoredGroup(
            prompt=g.prompt,
            completions=_scored(g.result.completions, g.item, verifier),
            tokenizer_id=tokenizer_id,
            prompt_token_ids=g.result.prompt_token_ids,
            task=g.item.ref,
            producer="local",
            token_source=TokenSource.SAMPLED,
        )
        for g in groups
    ]


def _scored(
    completions: Sequence[Completion], item: TaskItem, verifier: Verifier
) -> tuple[ScoredCompletion, ...]:
    """``completions`` of ``item`` with this node's rewards (token ids and log-probs kept)."""
    return tuple(
        ScoredCompletion(
            text=c.text,
            reward=verifier.score(item, c.text),
            finish_reason=c.finish_reason,
            token_ids=c.token_ids,
            behaviour_logprobs=c.logprobs,
        )
        for c in completions
    )


def derive_group_task(group: RolloutGroup) -> TaskItem:
    """Re-derive an external group's task and check the question and answer it claims.

    Raises:
        RejectedInput: digest mismatch, unknown family, derivation failure
            (see :func:`~sapo_async.tasks.derive`), or ``task_mismatch`` when the claimed
            question or answer differs from the re-derived one.
    """
    item = derive(group.task, group.task_config)
    if item.question != group.question or item.answer != group.answer:
        raise RejectedInput(
            "task_mismatch",
            f"{group.task.family}#{group.task.index}: claimed question/answer differ from "
            "the re-derived ones",
            producer=group.producer,
        )
    return item


def score_rollout_group(
    group: RolloutGroup,
    verifier: Verifier,
    *,
    prompt_style: PromptStyle = "compact",
    chat_tokenizer: Any = None,
    item: TaskItem | None = None,
) -> ScoredGroup:
    """Score any wire group (usually another node's) with this node's verifier.

    Args:
        group: the group (its rewards are never trusted: there are none on the wire).
        verifier: this node's verifier.
        prompt_style: this node's prompt style (the training prompt is ours).
        chat_tokenizer: this node's chat tokenizer, if it templates prompts.
        item: the already re-derived task (skips :func:`derive_group_task`).

    Raises:
        RejectedInput: the task does not re-derive to what the group claims.
    """
    item = item or derive_group_task(group)
    return ScoredGroup(
        prompt=build_prompt(item, prompt_style, chat_tokenizer),
        completions=_scored(group.completions, item, verifier),
        tokenizer_id=group.tokenizer_id,
        prompt_token_ids=None,
        task=group.task,
        producer=group.producer,
        token_source=TokenSource.TEXT,
    )
