"""One node's learner: its model, tasks, generator, verifier and GRPO trainer together.

Owns :class:`Learner` (generate this node's groups of a round, score any group, take a
GRPO step on a chosen list, checkpoint and restore), its :class:`LearnerSettings`, and
:func:`build_learner`, which loads a learner as a :class:`~sapo_async.node.spec.NodeSpec`
asks. Rounds are run by the round loop (:mod:`.rounds`), a lone node's too
(``sapo-async train``: :mod:`.alone`). The group-level pieces are pure (:mod:`.groups`).

The round counter (:attr:`Learner.round`, the next round to run) is kept here because it
is checkpointed with the weights, and moved through one setter, :meth:`Learner.set_round`,
by exactly two callers: the round loop after a round trains
(:meth:`~sapo_async.node.rounds.RoundLoop.train_round`) and the assembly that resumes a
node past its journal (:func:`~sapo_async.node.swarm.assemble`); :meth:`Learner.restore`
sets it from the checkpoint it loads.

Deliberately does not know about NATS, signing or the ledger.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.node.checkpoint import CheckpointState, load_checkpoint, save_checkpoint
from sapo_async.node.groups import (
    GeneratedGroup,
    generate_groups,
    round_seed,
    score_generated,
    score_rollout_group,
)
from sapo_async.node.spec import NodeSpec, TrainingSpec
from sapo_async.policy.generation.base import Generator
from sapo_async.policy.generation.transformers_backend import TransformersGenerator
from sapo_async.policy.grpo.logprobs import cpu_bf16
from sapo_async.policy.grpo.trainer import ScoredGroup, StepMetrics, Trainer, TrainerConfig
from sapo_async.tasks import PromptStyle, TaskItem, TaskSource, Verifier
from sapo_async.tasks.spec import preset
from sapo_async.wire import RolloutGroup, SamplingParams

__all__ = ["Learner", "LearnerSettings", "build_learner"]


_ROUND = TrainingSpec()  # the one source of the round's defaults


@dataclass(frozen=True, slots=True)
class LearnerSettings:
    """One learner's round settings (defaults: :class:`~sapo_async.node.spec.TrainingSpec`'s).

    Attributes:
        swarm_seed: shared by all nodes of a swarm (questions and sampling derive from it).
        node_index: this node's index in the task index layout (< 2**20).
        questions_per_round: B, questions per round.
        completions_per_question: L, completions per question.
        sampling: sampling parameters (temperature 1, no truncation by default).
        prompt_style: ``compact`` (tiny model) or ``instruct`` (real models).
        chat_template: wrap prompts in the tokenizer's chat template.
        format_reward: optional bonus for using the answer tags (0 = off).
        trainer: GRPO settings; the trainer gets :meth:`trainer_config`, whose
            ``max_completion_tokens`` is ``sampling.max_new_tokens``.
    """

    swarm_seed: int = _ROUND.seed
    node_index: int = 0
    questions_per_round: int = _ROUND.questions_per_round
    completions_per_question: int = _ROUND.completions_per_question
    sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(
            temperature=_ROUND.temperature,
            top_p=_ROUND.top_p,
            top_k=0,
            max_new_tokens=_ROUND.max_new_tokens,
        )
    )
    prompt_style: PromptStyle = "compact"
    chat_template: bool = False
    format_reward: float = 0.0
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def trainer_config(self) -> TrainerConfig:
        """The trainer's settings, derived here only: ``trainer`` with one completion length
        (every token generated is trained on, and dr_grpo's normaliser is the length
        generation was allowed)."""
        return self.trainer.replace(max_completion_tokens=self.sampling.max_new_tokens)

    @classmethod
    def of(
        cls,
        training: TrainingSpec,
        *,
        node_index: int,
        prompt_style: PromptStyle,
        chat_template: bool,
    ) -> LearnerSettings:
        """The settings a node's :class:`~sapo_async.node.spec.TrainingSpec` asks for."""
        return cls(
            swarm_seed=training.seed,
            node_index=node_index,
            questions_per_round=training.questions_per_round,
            completions_per_question=training.completions_per_question,
            sampling=SamplingParams(
                temperature=training.temperature,
                top_p=training.top_p,
                top_k=0,
                max_new_tokens=training.max_new_tokens,
            ),
            prompt_style=prompt_style,
            chat_template=chat_template,
            trainer=training.trainer,
        )


class Learner:
    """One node's model and what it does with it: generate, score and train.

    Args:
        model: the causal LM (trained in place; the generator shares it on CPU).
        tokenizer: its tokenizer.
        tasks: where questions come from.
        settings: round settings.
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
        settings: LearnerSettings | None = None,
        *,
        model_id: str = "model",
        generator: Generator | None = None,
    ) -> None:
        self.settings = settings or LearnerSettings()
        self.tasks = tasks
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.trainer = Trainer(
            model,
            tokenizer,
            self.settings.trainer_config(),
            add_special_tokens=not self.settings.chat_template,
        )
        self.generator: Generator = generator or TransformersGenerator(
            model,
            tokenizer,
            model_id=model_id,
            add_special_tokens=not self.settings.chat_template,
        )
        self.verifier = Verifier(format_reward=self.settings.format_reward)
        self._round = 0
        self._chat = tokenizer if self.settings.chat_template else None

    @property
    def round(self) -> int:
        """The next round this learner runs (see the module docstring: who moves it)."""
        return self._round

    def set_round(self, round_: int) -> None:
        """Move the round counter (the one setter; see the module docstring).

        Raises:
            ValueError: a negative round.
        """
        if round_ < 0:
            raise ValueError(f"round must be >= 0, got {round_}")
        self._round = round_

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
        return self.tasks.round_items(
            self.settings.node_index, r, self.settings.questions_per_round
        )

    async def generate(self, round_: int | None = None) -> list[GeneratedGroup]:
        """Generate this node's B x L completions of a round (default: the current one).

        Raises:
            GenerationError: the generator failed.
        """
        r = self.round if round_ is None else round_
        cfg = self.settings
        return await generate_groups(
            self.generator,
            self.round_items(r),
            cfg.sampling,
            n=cfg.completions_per_question,
            seed=round_seed(cfg.swarm_seed, cfg.node_index, r),
            prompt_style=cfg.prompt_style,
            chat_tokenizer=self._chat,
        )

    async def evaluate(
        self, questions: int, completions: int, *, seed: int, batch: int = 8
    ) -> list[ScoredGroup]:
        """Sample ``completions`` answers to each of ``questions`` held-out questions (the
        task source's ``eval`` draws, apart from the rounds' and the same for every node; a
        small family such as one-digit sums repeats its questions in both) with this node's
        current weights, prompt and sampler, scored by its own verifier: a node's reward
        measured on many more answers than a round has.
        Generates ``batch`` questions at a time (bounds the KV cache of a real model).

        Raises:
            ConfigError: questions, completions or batch below 1.
            GenerationError: the generator failed.
        """
        if completions < 1 or batch < 1:
            raise ConfigError(
                f"completions and batch must be >= 1, got {completions} and {batch}",
                field="eval.completions",
            )
        items = self.tasks.eval_items(questions)
        scored: list[ScoredGroup] = []
        for start in range(0, len(items), batch):
            groups = await generate_groups(
                self.generator,
                items[start : start + batch],
                self.settings.sampling,
                n=completions,
                seed=seed + start,
                prompt_style=self.settings.prompt_style,
                chat_tokenizer=self._chat,
            )
            scored += self.score_local(groups)
        return scored

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
            prompt_style=self.settings.prompt_style,
            chat_tokenizer=self._chat,
            item=item,
        )

    def train(self, groups: Sequence[ScoredGroup]) -> StepMetrics:
        """One GRPO step on a chosen list of scored groups (local and external).

        Raises:
            TrainingError: non-finite loss or gradient.
        """
        return self.trainer.step(groups)

    def save(self, directory: Path, extra: dict[str, Any] | None = None) -> Path:
        """Checkpoint model, optimizer, round and RNG states (see :mod:`.checkpoint`), and
        ``extra`` (small JSON data the checkpoint carries for the caller).

        Raises:
            CheckpointError: the write failed.
        """
        return save_checkpoint(
            directory,
            model=self.model,
            optimizer=self.trainer.optimizer,
            round_=self.round,
            policy_version=self.policy_version,
            extra=extra,
        )

    def restore(self, directory: Path) -> CheckpointState:
        """Restore the latest good checkpoint in ``directory`` into this node.

        Returns:
            What was loaded, and which damaged newer checkpoints were skipped.

        Raises:
            CheckpointError: no usable checkpoint, or an incompatible one.
        """
        state = load_checkpoint(directory, model=self.model, optimizer=self.trainer.optimizer)
        self.set_round(state.round)
        self.trainer.policy_version = state.policy_version
        return state


def model_context(model: Any) -> int | None:
    """The longest sequence (prompt + completion) ``model`` takes, in tokens, if it says."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_fits_context(
    model: Any, max_new_tokens: int, *, model_id: str, field: str = "training.max_new_tokens"
) -> None:
    """Refuse a completion cap that leaves no room for a prompt in the model's context.

    Raises:
        ConfigError: ``max_new_tokens`` is at least the model's context length (named).
    """
    context = model_context(model)
    if context is not None and max_new_tokens >= context:
        raise ConfigError(
            f"{field} = {max_new_tokens}: must be below the context of {model_id} "
            f"({context} tokens, prompt included)",
            field=field,
        )


def build_learner(
    spec: NodeSpec | None = None, *, node_index: int | None = None, offload: bool = False
) -> Learner:
    """Load one node's learner as ``spec`` asks: model, tasks, generator, verifier, trainer.

    Uses ``spec.policy`` (model, regime, tasks, prompt style, device) and
    ``spec.training`` (B, L, sampling, GRPO settings, seed, overlap); with
    ``training.overlap`` the generator gets its own copy of the weights, so the next round
    can be generated while this one trains.

    Args:
        spec: the node's spec (None: the defaults, the tiny model on CPU).
        node_index: this node's slot in the task index layout (default: the spec's, or 0).
        offload: run generation in a worker thread.

    Raises:
        ConfigError: an invalid setting (named).
    """
    import torch
    import transformers

    from sapo_async.policy.models import (
        LoadedModel,
        load_model,
        load_tiny_model,
        tiny_spec,
        train_last_layers,
    )

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call] # one bar per node clutters the display

    spec = spec or NodeSpec()
    policy, training = spec.policy, spec.training
    model = policy.model
    if isinstance(model, LoadedModel):
        loaded = model
    elif model in ("tiny", "auto"):
        loaded = load_tiny_model(tiny_spec(policy.regime), device=policy.device)
    else:
        loaded = load_model(str(model), device=policy.device)
    check_fits_context(loaded.model, training.max_new_tokens, model_id=loaded.model_id)
    if policy.train_layers is not None:
        train_last_layers(loaded.model, policy.train_layers)
    families = preset(policy.tasks) if isinstance(policy.tasks, str) else tuple(policy.tasks)
    is_tiny = loaded.model_id.startswith("sapo-tiny")
    style: PromptStyle = (
        policy.prompt_style
        if policy.prompt_style != "auto"
        else ("compact" if is_tiny else "instruct")
    )
    index = node_index if node_index is not None else (spec.node_index or 0)
    settings = LearnerSettings.of(
        training,
        node_index=index,
        prompt_style=style,
        chat_template=style == "instruct"
        and getattr(loaded.tokenizer, "chat_template", None) is not None,
    )
    params = sum(p.numel() for p in loaded.model.parameters())
    gen_dtype = generation_dtype(policy.generation_dtype, params=params, device=policy.device)
    own_copy = training.overlap or gen_dtype == torch.bfloat16
    sampler_model = copy.deepcopy(loaded.model) if own_copy else loaded.model
    if gen_dtype == torch.bfloat16:
        sampler_model = sampler_model.to(torch.bfloat16)
    generator = TransformersGenerator(
        sampler_model,
        loaded.tokenizer,
        model_id=loaded.model_id,
        add_special_tokens=not settings.chat_template,
        shares_trainer_module=not own_copy,
        offload_to_thread=offload,
    )
    return Learner(
        loaded.model,
        loaded.tokenizer,
        TaskSource(families, swarm_seed=training.seed),
        settings,
        model_id=loaded.model_id,
        generator=generator,
    )


def generation_dtype(asked: str, *, params: int, device: str) -> Any:
    """The dtype the CPU sampler's weights take (``PolicySpec.generation_dtype``).

    ``"auto"``: bfloat16 for a model of at least
    :data:`~sapo_async.limits.FAST_PATH_MIN_PARAMS` parameters on a CPU with bf16
    instructions (SmolLM2 sampled 1.6x faster in bf16 than in float32 here at the
    real-model table's sizes, bench/results/real.json), float32 for
    smaller ones (the tiny model: no gain, and its recorded results were float32) and on a
    CPU without them, where bf16 is emulated and slower. On CUDA the sampler shares the
    trainer's module (loaded in bf16 there): float32 means "as loaded".
    """
    import torch

    from sapo_async.limits import FAST_PATH_MIN_PARAMS

    small = params < FAST_PATH_MIN_PARAMS
    if device != "cpu" or asked == "float32" or (asked == "auto" and (small or not _cpu_bf16())):
        return torch.float32
    return torch.bfloat16


def _cpu_bf16() -> bool:
    return cpu_bf16()
