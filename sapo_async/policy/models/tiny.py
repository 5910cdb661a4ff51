"""The tiny model: a ~1 M parameter Llama built offline, warm-started, cached on disk.

Owns the recipe ``TinyModelSpec -> directory with a Hugging Face model + tokenizer``:

1. a character-level tokenizer trained on generated task text (:mod:`.tokenizer`);
2. a ``LlamaForCausalLM`` (hidden 128, 4 layers, 4 heads, FFN 384, tied embeddings)
   initialised from ``torch.manual_seed(spec.seed)``;
3. a supervised warm start on generated (prompt, answer) pairs, loss on the answer only,
   where a fraction ``tagged_fraction`` of targets wears the ``<answer>`` tags and the rest
   are bare answers (the verifier scores untagged completions 0, so this fraction sets how
   much RL has to *discover* the format: the sparse versus dense regimes);
4. a sampled reward measured on held-out (``eval``) items before and after the warm start,
   recorded in ``build.json`` beside the weights.

The directory is keyed by a hash of every setting (and :data:`RECIPE_VERSION`), built on
first use into a temporary directory and renamed into place, so readers never see half a
model and two concurrent builders both end with one complete copy.

Deliberately does not know about RL or the swarm. Warm-start items come from the
``warmstart`` purpose of the index layout, so they never coincide with training or
evaluation items.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from sapo_async.errors import ConfigError
from sapo_async.logs import get_logger
from sapo_async.policy.digest import tokenizer_id
from sapo_async.policy.generation.transformers_backend import TransformersGenerator
from sapo_async.policy.models.loading import LoadedModel, load_model
from sapo_async.policy.models.packaged import cache_root
from sapo_async.policy.models.tokenizer import train_char_tokenizer
from sapo_async.tasks import (
    TaskItem,
    TaskSource,
    Verifier,
    format_prompt,
    format_target,
    preset,
)
from sapo_async.wire import SamplingParams, keccak256

__all__ = [
    "RECIPE_VERSION",
    "REGIMES",
    "TinyModelSpec",
    "WarmStartReport",
    "WarmStartSpec",
    "build_tiny_model",
    "ensure_tiny_model",
    "evaluate_reward",
    "load_tiny_model",
    "read_report",
    "tiny_model_dir",
    "tiny_spec",
]

RECIPE_VERSION = 1
"""Bumped whenever the build recipe changes, so stale caches are never reused."""

_log = get_logger("sapo_async.policy.models.tiny")

# Characters always in the vocabulary even if the generated sample happens to miss one.
_BASE_ALPHABET = "0123456789 +-*/=()."


@dataclass(frozen=True, slots=True)
class WarmStartSpec:
    """The supervised warm start.

    Attributes:
        steps: optimizer steps.
        batch: examples per step.
        lr: AdamW learning rate.
        tagged_fraction: fraction of targets written as ``<answer>A</answer>`` (the rest
            are bare ``A``).
        eval_questions: held-out questions for the before/after reward.
        eval_samples: completions per eval question (temperature 1).
    """

    steps: int = 400
    batch: int = 128
    lr: float = 1e-3
    tagged_fraction: float = 0.05
    eval_questions: int = 64
    eval_samples: int = 4


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """Everything the tiny model's bytes depend on (its cache key).

    Attributes:
        seed: seeds tokenizer sample, initialisation, data order and eval sampling.
        tasks: task preset name the model is warm-started on (``"cpu"`` by default).
        prompt_style: prompt style used in warm start (and expected in RL).
        hidden: hidden size.
        layers: decoder layers.
        heads: attention heads (no grouped-query attention).
        ffn: MLP inner size.
        max_positions: longest prompt + completion in tokens.
        max_new_tokens: completion cap used for the eval reward.
        warm: the warm start.
    """

    seed: int = 0
    tasks: str = "cpu"
    prompt_style: Literal["compact", "instruct"] = "compact"
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    ffn: int = 384
    max_positions: int = 64
    max_new_tokens: int = 16
    warm: WarmStartSpec = field(default_factory=WarmStartSpec)

    def key(self) -> str:
        """Hex digest of every setting plus :data:`RECIPE_VERSION` (the cache key)."""
        blob = json.dumps(
            {"recipe": RECIPE_VERSION, **asdict(self)}, sort_keys=True, separators=(",", ":")
        )
        return keccak256(blob.encode()).hex()[:16]


# Two warm starts on the CPU preset (measured numbers in docs/learning.md):
#  sparse: arithmetic learned but 95 % of targets bare, so few completions carry the tag
#          the verifier demands: start reward ~0.01-0.05, few informative groups.
#  dense:  every target tagged but a short warm start, so the format is known and the
#          skill is partial: start reward ~0.05-0.2 with partial credit.
REGIMES: dict[str, TinyModelSpec] = {
    "sparse": TinyModelSpec(warm=WarmStartSpec(steps=400, tagged_fraction=0.05)),
    "dense": TinyModelSpec(warm=WarmStartSpec(steps=150, tagged_fraction=1.0)),
}


def tiny_spec(regime: str = "sparse", **overrides: Any) -> TinyModelSpec:
    """The spec of a regime (``"sparse"`` or ``"dense"``) with optional overrides.

    Overrides name TinyModelSpec fields, or WarmStartSpec fields prefixed ``warm_``
    (e.g. ``warm_steps=50``).

    Raises:
        ConfigError: unknown regime or override name.
    """
    if regime not in REGIMES:
        raise ConfigError(f"unknown regime {regime!r}; allowed: {sorted(REGIMES)}", field="regime")
    spec = REGIMES[regime]
    warm_over = {k[5:]: v for k, v in overrides.items() if k.startswith("warm_")}
    top_over = {k: v for k, v in overrides.items() if not k.startswith("warm_")}
    try:
        return replace(spec, warm=replace(spec.warm, **warm_over), **top_over)
    except TypeError as exc:
        raise ConfigError(f"unknown tiny model setting: {exc}", field="tiny") from exc


def _validate(spec: TinyModelSpec) -> None:
    if spec.hidden % spec.heads:
        raise ConfigError(f"hidden {spec.hidden} is not divisible by heads {spec.heads}")
    if not 0.0 <= spec.warm.tagged_fraction <= 1.0:
        raise ConfigError(
            f"tagged_fraction must be in [0, 1], got {spec.warm.tagged_fraction}",
            field="warm.tagged_fraction",
        )
    if spec.warm.steps < 0 or spec.warm.batch < 1 or spec.warm.batch > 1024:
        raise ConfigError("warm start needs steps >= 0 and 1 <= batch <= 1024", field="warm")


def tiny_model_dir(spec: TinyModelSpec, cache_dir: Path | None = None) -> Path:
    """The cache directory of ``spec`` (whether built or not)."""
    return (cache_dir or cache_root()) / "tiny" / spec.key()


@dataclass(frozen=True, slots=True)
class WarmStartReport:
    """What a build measured (also written to ``build.json``).

    Attributes:
        reward_before: mean sampled reward on eval items before the warm start.
        reward_after: the same after it.
        tag_rate_after: fraction of sampled completions containing ``<answer>``.
        steps: warm-start steps taken.
        seconds: wall time of the whole build.
        params: parameter count.
    """

    reward_before: float
    reward_after: float
    tag_rate_after: float
    steps: int
    seconds: float
    params: int


def _make_model(spec: TinyModelSpec, tokenizer: Any) -> Any:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        attention_dropout=0.0,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def evaluate_reward(
    model: Any,
    tokenizer: Any,
    items: list[TaskItem],
    *,
    samples: int,
    max_new_tokens: int,
    seed: int,
    prompt_style: Literal["compact", "instruct"] = "compact",
) -> tuple[float, float]:
    """Mean sampled reward (temperature 1, no truncation) and tag rate on ``items``.

    Returns:
        ``(mean reward, fraction of completions containing <answer>)``.
    """
    gen = TransformersGenerator(model, tokenizer, model_id="tiny")
    results = gen.generate_sync(
        [format_prompt(it, prompt_style) for it in items],
        SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens),
        n=samples,
        seed=seed,
    )
    verifier = Verifier()
    rewards: list[float] = []
    tags = 0
    for item, res in zip(items, results, strict=True):
        for comp in res.completions:
            rewards.append(verifier.score(item, comp.text))
            tags += "<answer>" in comp.text
    return sum(rewards) / len(rewards), tags / len(rewards)


def _warm_start(model: Any, tokenizer: Any, source: TaskSource, spec: TinyModelSpec) -> None:
    warm = spec.warm
    rng = random.Random(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=warm.lr, weight_decay=0.0)
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id)
    model.train()
    for step in range(warm.steps):
        rows: list[list[int]] = []
        labels: list[list[int]] = []
        for item in source.round_items(0, step, warm.batch, purpose="warmstart"):
            prompt = tokenizer(format_prompt(item, spec.prompt_style))["input_ids"]
            tagged = rng.random() < warm.tagged_fraction
            target = tokenizer(format_target(item.answer, tagged=tagged))["input_ids"] + [eos]
            rows.append(prompt + target)
            labels.append([-100] * len(prompt) + target)
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        lab = torch.tensor([lb + [-100] * (width - len(lb)) for lb in labels])
        mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), lab[:, 1:].reshape(-1), ignore_index=-100
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            _log.debug("warm_start_stepped", step=step, loss=float(loss.detach()))


def build_tiny_model(spec: TinyModelSpec, out_dir: Path) -> WarmStartReport:
    """Build the tiny model of ``spec`` into ``out_dir`` (created; must not exist).

    Returns:
        What the build measured.

    Raises:
        ConfigError: inconsistent settings.
    """
    _validate(spec)
    t0 = time.perf_counter()
    source = TaskSource(preset(spec.tasks), swarm_seed=0)
    sample = source.round_items(0, 0, 1024, purpose="warmstart")
    texts = [_BASE_ALPHABET]
    for it in sample:
        texts += [format_prompt(it, spec.prompt_style), format_target(it.answer, tagged=False)]
    tokenizer = train_char_tokenizer(texts)
    model = _make_model(spec, tokenizer)
    evals = source.eval_items(spec.warm.eval_questions)

    def measure() -> tuple[float, float]:
        return evaluate_reward(
            model,
            tokenizer,
            evals,
            samples=spec.warm.eval_samples,
            max_new_tokens=spec.max_new_tokens,
            seed=spec.seed,
            prompt_style=spec.prompt_style,
        )

    before, _ = measure()
    _warm_start(model, tokenizer, source, spec)
    after, tag_rate = measure()
    report = WarmStartReport(
        reward_before=before,
        reward_after=after,
        tag_rate_after=tag_rate,
        steps=spec.warm.steps,
        seconds=time.perf_counter() - t0,
        params=sum(p.numel() for p in model.parameters()),
    )
    out_dir.mkdir(parents=True)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
    manifest = {
        "spec": asdict(spec),
        "key": spec.key(),
        "tokenizer_id": tokenizer_id(tokenizer),
        "report": asdict(report),
    }
    (out_dir / "build.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    _log.info("tiny_model_built", key=spec.key(), **asdict(report))
    return report


def read_report(model_dir: Path) -> WarmStartReport:
    """The :class:`WarmStartReport` stored beside a built tiny model."""
    data = json.loads((model_dir / "build.json").read_text())
    return WarmStartReport(**data["report"])


def ensure_tiny_model(spec: TinyModelSpec, cache_dir: Path | None = None) -> Path:
    """Return the directory of ``spec``'s model, building it first if it is not cached.

    Raises:
        ConfigError: inconsistent settings.
    """
    final = tiny_model_dir(spec, cache_dir)
    if (final / "build.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    _log.info(
        "tiny_model_building",
        key=spec.key(),
        into=str(final),
        note="built once, one to three minutes on 2 cores, then cached",
    )
    try:
        build_tiny_model(spec, tmp / "model")
        try:
            os.replace(tmp / "model", final)
        except OSError:
            # another builder won the race; its copy is complete (it has build.json)
            if not (final / "build.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_tiny_model(
    spec: TinyModelSpec | None = None, *, cache_dir: Path | None = None, device: str = "cpu"
) -> LoadedModel:
    """Load (building on first use) the tiny model of ``spec`` (default: sparse regime).

    Raises:
        ConfigError: inconsistent settings.
    """
    spec = spec or REGIMES["sparse"]
    path = ensure_tiny_model(spec, cache_dir)
    return load_model(path, device=device, dtype="float32", model_id=f"sapo-tiny-{spec.key()}")
