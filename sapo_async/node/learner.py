"""One node's round, in reusable pieces: generate groups, score any group, train.

Owns the glue between tasks, a generator, the verifier and the GRPO trainer for ONE node:

* :func:`generate_groups`: B task items -> B x L completions (a :class:`GeneratedGroup`
  each);
* :func:`to_rollout_group`: a generated group -> the wire :class:`RolloutGroup`;
* :func:`score_generated` / :func:`score_rollout_group`: any group, local or external,
  scored by *this* node's verifier (an external group's task is re-derived from its
  TaskRef and config and checked against the question and answer it claims);
* :class:`LocalTrainerNode`: a node alone (J = 0); :meth:`~LocalTrainerNode.run_round`
  and :func:`run_rounds` are what ``sapo-async train`` runs, and the swarm reuses the
  node's pieces with external groups mixed into :meth:`~LocalTrainerNode.train`.

Deliberately does not know about NATS, signing or the ledger.

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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from sapo_async.errors import RejectedInput
from sapo_async.node.checkpoint import load_checkpoint, save_checkpoint
from sapo_async.policy.generation.base import GenerationResult, Generator
from sapo_async.policy.generation.transformers_backend import TransformersGenerator
from sapo_async.policy.grpo.trainer import (
    ScoredCompletion,
    ScoredGroup,
    StepMetrics,
    Trainer,
    TrainerConfig,
)
from sapo_async.tasks import (
    PromptStyle,
    TaskItem,
    TaskSource,
    Verifier,
    apply_chat_template,
    derive,
    format_prompt,
)
from sapo_async.wire import SCHEMA_VERSION, RolloutGroup, SamplingParams

__all__ = [
    "GeneratedGroup",
    "LocalTrainerNode",
    "NodeConfig",
    "RoundMetrics",
    "derive_group_task",
    "generate_groups",
    "round_seed",
    "run_rounds",
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
    out: list[ScoredGroup] = []
    for g in groups:
        comps = tuple(
            ScoredCompletion(
                text=c.text,
                reward=verifier.score(g.item, c.text),
                finish_reason=c.finish_reason,
                token_ids=c.token_ids,
                behaviour_logprobs=c.logprobs,
            )
            for c in g.result.completions
        )
        out.append(
            ScoredGroup(
                prompt=g.prompt,
                completions=comps,
                tokenizer_id=tokenizer_id,
                prompt_token_ids=g.result.prompt_token_ids,
                task=g.item.ref,
                producer="local",
            )
        )
    return out


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
    comps = tuple(
        ScoredCompletion(
            text=c.text,
            reward=verifier.score(item, c.text),
            finish_reason=c.finish_reason,
            token_ids=c.token_ids,
            behaviour_logprobs=c.logprobs,
        )
        for c in group.completions
    )
    return ScoredGroup(
        prompt=build_prompt(item, prompt_style, chat_tokenizer),
        completions=comps,
        tokenizer_id=group.tokenizer_id,
        prompt_token_ids=None,
        task=group.task,
        producer=group.producer,
    )


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One node's round settings.

    Attributes:
        swarm_seed: shared by all nodes of a swarm (questions and sampling derive from it).
        node_index: this node's index in the task index layout (< 2**20).
        batch: questions per round (B).
        group_size: completions per question (L).
        sampling: sampling parameters (temperature 1, no truncation by default).
        prompt_style: ``compact`` (tiny model) or ``instruct`` (real models).
        chat_template: wrap prompts in the tokenizer's chat template.
        format_reward: optional bonus for using the answer tags (0 = off).
        trainer: GRPO settings.
    """

    swarm_seed: int = 0
    node_index: int = 0
    batch: int = 8
    group_size: int = 8
    sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(
            temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16
        )
    )
    prompt_style: PromptStyle = "compact"
    chat_template: bool = False
    format_reward: float = 0.0
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


@dataclass(frozen=True, slots=True)
class RoundMetrics:
    """One round of a node.

    Attributes:
        round: the round index.
        generate_s / score_s / train_s: wall time of each phase.
        generated_tokens: completion tokens sampled this round.
        local_reward_mean: mean reward of this round's own completions.
        informative_local: own groups whose rewards differ.
        step: the trainer's metrics.
    """

    round: int
    generate_s: float
    score_s: float
    train_s: float
    generated_tokens: int
    local_reward_mean: float
    informative_local: int
    step: StepMetrics

    def as_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict (step metrics prefixed ``step_``)."""
        d = {k: v for k, v in asdict(self).items() if k != "step"}
        d.update({f"step_{k}": v for k, v in asdict(self.step).items() if k != "extra"})
        return d


class LocalTrainerNode:
    """A node that generates, scores and trains on its own model.

    Args:
        model: the causal LM (trained in place; the generator shares it on CPU).
        tokenizer: its tokenizer.
        tasks: where questions come from.
        config: round settings.
        model_id: name reported in rollout groups.
        generator: a generator to use instead of a TransformersGenerator over ``model``
            (e.g. a vLLM engine or the scripted fake).

    Raises:
        ConfigError: invalid settings.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        tasks: TaskSource,
        config: NodeConfig | None = None,
        *,
        model_id: str = "model",
        generator: Generator | None = None,
    ) -> None:
        self.config = config or NodeConfig()
        self.tasks = tasks
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.trainer = Trainer(
            model,
            tokenizer,
            self.config.trainer,
            add_special_tokens=not self.config.chat_template,
        )
        self.generator: Generator = generator or TransformersGenerator(
            model,
            tokenizer,
            model_id=model_id,
            add_special_tokens=not self.config.chat_template,
        )
        self.verifier = Verifier(format_reward=self.config.format_reward)
        self.round = 0
        self._chat = tokenizer if self.config.chat_template else None

    @property
    def tokenizer_id(self) -> str:
        """This node's tokenizer digest."""
        return self.trainer.tokenizer_id

    @property
    def policy_version(self) -> int:
        """Optimizer steps taken."""
        return self.trainer.policy_version

    def round_items(self, round_: int | None = None) -> list[TaskItem]:
        """This node's B questions of a round (default: the current one)."""
        r = self.round if round_ is None else round_
        return self.tasks.round_items(self.config.node_index, r, self.config.batch)

    async def generate(self, round_: int | None = None) -> list[GeneratedGroup]:
        """Generate this node's B x L completions of a round (default: the current one).

        Raises:
            GenerationError: the generator failed.
        """
        r = self.round if round_ is None else round_
        cfg = self.config
        return await generate_groups(
            self.generator,
            self.round_items(r),
            cfg.sampling,
            n=cfg.group_size,
            seed=round_seed(cfg.swarm_seed, cfg.node_index, r),
            prompt_style=cfg.prompt_style,
            chat_tokenizer=self._chat,
        )

    def score_local(self, groups: Sequence[GeneratedGroup]) -> list[ScoredGroup]:
        """Score this node's own groups."""
        return score_generated(groups, self.verifier, tokenizer_id=self.tokenizer_id)

    def score_external(self, group: RolloutGroup, item: TaskItem | None = None) -> ScoredGroup:
        """Score another node's group with this node's verifier and prompt style.

        Raises:
            RejectedInput: the task does not re-derive to what the group claims.
        """
        return score_rollout_group(
            group,
            self.verifier,
            prompt_style=self.config.prompt_style,
            chat_tokenizer=self._chat,
            item=item,
        )

    def to_rollout_groups(
        self, groups: Sequence[GeneratedGroup], *, swarm: str, producer: str
    ) -> list[RolloutGroup]:
        """Wire forms of this round's groups (round and policy version stamped)."""
        return [
            to_rollout_group(
                g,
                swarm=swarm,
                producer=producer,
                producer_round=self.round,
                policy_version=self.policy_version,
                model_id=self.model_id,
                tokenizer_id=self.tokenizer_id,
            )
            for g in groups
        ]

    def train(self, groups: Sequence[ScoredGroup]) -> StepMetrics:
        """One GRPO step on a chosen list of scored groups (local and external).

        Raises:
            TrainingError: non-finite loss or gradient.
        """
        return self.trainer.step(groups)

    async def run_round(
        self, external: Sequence[ScoredGroup] = (), *, advance: bool = True
    ) -> RoundMetrics:
        """Generate, score and train on this round's own groups plus ``external``.

        Args:
            external: already scored external groups to train on too (J of them).
            advance: move to the next round afterwards.

        Raises:
            GenerationError, TrainingError: from the generator or the trainer.
        """
        t0 = time.perf_counter()
        generated = await self.generate()
        t1 = time.perf_counter()
        local = self.score_local(generated)
        t2 = time.perf_counter()
        step = self.train([*local, *external])
        t3 = time.perf_counter()
        rewards = [c.reward for g in local for c in g.completions]
        metrics = RoundMetrics(
            round=self.round,
            generate_s=t1 - t0,
            score_s=t2 - t1,
            train_s=t3 - t2,
            generated_tokens=sum(
                len(c.token_ids or ()) for g in generated for c in g.result.completions
            ),
            local_reward_mean=sum(rewards) / max(len(rewards), 1),
            informative_local=sum(g.informative for g in local),
            step=step,
        )
        if advance:
            self.round += 1
        return metrics

    def save(self, directory: Path) -> Path:
        """Checkpoint model, optimizer, round and RNG states (see :mod:`.checkpoint`).

        Raises:
            CheckpointError: the write failed.
        """
        return save_checkpoint(
            directory,
            model=self.model,
            optimizer=self.trainer.optimizer,
            round_=self.round,
            policy_version=self.policy_version,
        )

    def restore(self, directory: Path) -> None:
        """Restore the latest checkpoint in ``directory`` into this node.

        Raises:
            CheckpointError: missing, torn or incompatible checkpoint.
        """
        state = load_checkpoint(directory, model=self.model, optimizer=self.trainer.optimizer)
        self.round = state.round
        self.trainer.policy_version = state.policy_version


def run_rounds(
    node: LocalTrainerNode,
    rounds: int,
    *,
    on_round: Callable[[RoundMetrics], None] | None = None,
) -> list[RoundMetrics]:
    """Run ``rounds`` rounds of a lone node (J = 0) from its current round.

    Args:
        node: the node.
        rounds: how many rounds.
        on_round: called after each round (progress display, JSONL log, checkpoints).

    Returns:
        The per-round metrics.
    """

    async def _run() -> list[RoundMetrics]:
        out: list[RoundMetrics] = []
        for _ in range(rounds):
            m = await node.run_round()
            out.append(m)
            if on_round is not None:
                on_round(m)
        return out

    return anyio.run(_run)
