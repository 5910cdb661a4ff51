"""Where a SmolLM2 node-round's time goes, each stage against this machine's own limits
(issue 56, item 1): the profile section of ``just bench real`` (:mod:`real` calls
:func:`profile`).

Limits, measured in the same run at the same thread count, before and after each size's
stages (the higher kept): torch matmul throughput in float32 and bfloat16 (the best of the
model's own shapes: an MLP projection at 2,048 tokens and the vocabulary head on a 512-row
log-prob chunk), and a memory copy (float32 to bfloat16, as the weight sync does) in GB/s.

Sizes: ``table`` (the real-model table's: B=4 questions x L=4 completions, 32 new tokens,
the last 4 blocks trained) and ``large`` (8 x 8, 128 tokens, every block trained). Stages
of one node-round at each, on the node's own objects (``build_learner``):

* ``generation``: ``Learner.generate`` (the node's sampler on its bf16 copy where the CPU
  has bf16 instructions), stops honoured; beside it the sampler as it was before issue 56
  (:func:`sampler_before_issue_56`: ``torch.multinomial``'s draw, the prefill's last
  position sliced before the head);
* ``scoring``: ``Learner.score_local`` (the verifier; no arithmetic worth counting);
* ``view_logprobs``: a receiver's candidate view of each group (``token_logprobs_batch``:
  the prompt once, the head only at completion positions, on the fp32 trainer module
  under the trainer's precision: bf16 autocast where the node's "auto" picks it),
  beside the view as it was before issue 56 (:func:`view_padded`: every row padded,
  full-vocabulary logits at every position; ``before_issue_56``);
* the GRPO step (``Learner.train``, rewards alternating 0/1 so every group counts) split
  as :data:`~sapo_async.policy.grpo.trainer.STAGES` says (``Trainer.stage_seconds``), once
  per trainer variant (:data:`VARIANTS`: ``float32`` as before issue 56, ``bf16`` with
  ``trainer.bf16`` (autocast, float32 master weights; where the CPU has bf16 instructions),
  ``*_shared`` with ``trainer.share_prompts``, each prompt run once), beside ``plain``: a bare
  forward, full log-softmax, token-mean loss, backward and AdamW over the same rows and
  the same trainable parameters (16 rows per pass, gradients accumulate);
* ``weight_sync``: the trained weights into the sampler's bf16 copy
  (``generator.sync_weights``);
* ``checkpoint``: ``Learner.save`` (model, optimizer, round) to a temporary directory.

The node's commit (a journal append of a few hashes) is not timed here.

``round_seconds`` adds up one node-round, before issue 56 (the sampler as it was, the
padded view, the ``float32`` step) and after (today's sampler and view, the step variant
the node's "auto" settings pick on this machine: ``default_step``): generation, scoring,
the view of each own group (one external candidate per own group, about what a 50/50 node
screens), the step, the weight sync, and the checkpoint over its interval
(``checkpoint_every_rounds``, the node's "auto").

FLOPs, counted from the model's config (two per multiply-add), per token through a block:
the q/k/v/o and gate/up/down projections; attention ``4 x width x q_dim`` per row position
per layer (scores and values over the padded width, the causal half not subtracted); the
head ``2 x hidden x vocab`` per position it projects. A backward through a trained block
costs twice its forward (input and weight gradients); the head's backward costs one
projection for the input gradient, one more for its weight when it trains (tied to the
embeddings: only with every block trained), and the product recomputes its chunk once
(activation checkpointing). The shared variants count what they run: each distinct
prompt once, then every row's completion attending to its prompt. AdamW is counted as
bytes (four float32 tensors read, three written per trained parameter) against the copy
bandwidth, as are the sync and the checkpoint (bytes written). ``of_limit`` is achieved /
limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from sapo_async.node.checkpoint import state_bytes
from sapo_async.node.learner import _cpu_bf16, build_learner
from sapo_async.node.plausibility import token_logprobs_batch
from sapo_async.node.spec import NodeSpec

MODEL = "smollm2-135m"
PLAIN_ROWS = 16
"""Rows per pass of the plain step (gradients accumulate): its full-vocabulary logits at the
large size would otherwise hold several GB at once."""


@dataclasses.dataclass(frozen=True)
class Size:
    """One profiled size: questions x completions, new tokens, blocks trained (None: all),
    and the trainer's micro-batch budget in padded tokens (None: the batch at once)."""

    questions: int
    completions: int
    new_tokens: int
    train_layers: int | None
    micro_batch_tokens: int | None = None


SIZES = {
    "table": Size(4, 4, 32, 4),
    # 64 rows x ~290 padded tokens through all 30 blocks at once kept ~24 GB of activations
    # (the first run was killed for memory); 16 rows a pass, as the plain step takes them
    "large": Size(8, 8, 128, None, micro_batch_tokens=16 * 300),
}
QUICK_SIZES = {
    "table": Size(2, 4, 8, 4),
    "large": Size(2, 4, 16, None, micro_batch_tokens=4 * 200),
}


VARIANTS = {
    "float32": {"bf16": False, "share_prompts": False},  # the step before issue 56
    "float32_shared": {"bf16": False, "share_prompts": True},
    "bf16": {"bf16": True, "share_prompts": False},
    "bf16_shared": {"bf16": True, "share_prompts": True},
}
"""The trainer settings each step variant runs (``float32``: the padded float32 step, the
node's step before issue 56; bf16 variants only where the CPU has bf16 instructions)."""


# -- limits -----------------------------------------------------------------------------


def _best(fn: Any, repeats: int) -> float:
    fn()  # warm-up (oneDNN picks its kernel on the first call)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def limits(hidden: int, ff: int, vocab: int, *, tokens: int, repeats: int) -> dict[str, Any]:
    """This machine's matmul GFLOP/s (float32, bfloat16) at the model's shapes, and its
    float32-to-bfloat16 copy bandwidth in GB/s."""
    shapes = {"mlp": (tokens, hidden, ff), "head": (512, hidden, vocab)}
    out: dict[str, Any] = {"shapes": {k: list(v) for k, v in shapes.items()}}
    for dtype in (torch.float32, torch.bfloat16):
        rates = {}
        for name, (m, k, n) in shapes.items():
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            rates[name] = 2 * m * k * n / _best(lambda a=a, b=b: a @ b, repeats) / 1e9
        key = str(dtype).removeprefix("torch.")
        out[f"{key}_gflops_by_shape"] = rates
        out[f"{key}_gflops"] = max(rates.values())
    src = torch.randn(32 * 2**20)
    dst = torch.empty(src.shape, dtype=torch.bfloat16)
    out["copy_gbps"] = src.numel() * 6 / _best(lambda: dst.copy_(src), repeats) / 1e9
    return out


def _higher(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Each number of two limit measurements at its higher (nested dicts alike)."""
    out: dict[str, Any] = {}
    for key, value in a.items():
        if isinstance(value, dict):
            out[key] = _higher(value, b[key])
        elif isinstance(value, float):
            out[key] = max(value, b[key])
        else:
            out[key] = value
    return out


# -- arithmetic -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arch:
    """The FLOP-relevant shape of a Llama-style model (see the module docstring)."""

    layers: int
    hidden: int
    q_dim: int
    kv_dim: int
    ff: int
    vocab: int

    @classmethod
    def of(cls, model: Any) -> Arch:
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(
            layers=c.num_hidden_layers,
            hidden=c.hidden_size,
            q_dim=c.num_attention_heads * head_dim,
            kv_dim=c.num_key_value_heads * head_dim,
            ff=c.intermediate_size,
            vocab=c.vocab_size,
        )

    @property
    def block(self) -> int:
        """FLOPs of one token through one block's projections."""
        h = self.hidden
        return 2 * (h * self.q_dim * 2 + h * self.kv_dim * 2 + 3 * h * self.ff)

    @property
    def head(self) -> int:
        """FLOPs of one position's vocabulary projection."""
        return 2 * self.hidden * self.vocab

    def blocks(self, rows: int, width: int, layers: int, context: int = 0) -> int:
        """A padded ``rows x width`` batch through ``layers`` blocks (attention included,
        over ``context`` keys: default ``width``)."""
        return layers * rows * width * (self.block + 4 * (context or width) * self.q_dim)


def _row_shapes(batch: list[Any]) -> tuple[int, int, int]:
    """Rows, padded width and completion tokens of the step's batch (as the trainer pads)."""
    lengths = [
        (len(g.prompt_token_ids), len(c.token_ids or ())) for g in batch for c in g.completions
    ]
    return len(lengths), max(p + c for p, c in lengths), sum(c for _, c in lengths)


def step_flops(
    arch: Arch,
    batch: list[Any],
    trained: int,
    head_trains: bool,
    frozen_passes: int,
    *,
    shared: bool,
) -> dict[str, int]:
    """FLOPs of the product's step stages and of the plain step over the same rows
    (``frozen_passes``: no-grad forwards for old and reference log-probs; ``shared``: each
    distinct prompt once, left-padded, then every row's completion after it)."""
    rows, width, comp = _row_shapes(batch)

    def blocks(layers: int) -> int:
        if not shared:
            return arch.blocks(rows, width, layers)
        prompts = {tuple(g.prompt_token_ids) for g in batch}
        p_width = max(len(p) for p in prompts)
        c_width = max(len(c.token_ids or ()) for g in batch for c in g.completions)
        return arch.blocks(len(prompts), p_width, layers) + arch.blocks(
            rows, c_width, layers, p_width + c_width
        )

    fwd = blocks(arch.layers) + comp * arch.head
    head_bwd = comp * arch.head * (3 if head_trains else 2)  # recompute, d input (, d weight)
    plain_head = rows * width * arch.head
    return {
        "old_logprobs": frozen_passes * fwd,
        "forward": fwd,
        "backward": 2 * blocks(trained) + head_bwd,
        "plain": arch.blocks(rows, width, arch.layers) * 1
        + 2 * arch.blocks(rows, width, trained)
        + plain_head * (3 if head_trains else 2),
    }


# -- stages -----------------------------------------------------------------------------


def _stage(
    seconds: float, *, flops: float = 0.0, nbytes: float = 0.0, limit: dict[str, Any], dtype: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": seconds}
    if flops:
        rate = flops / seconds / 1e9 if seconds > 0 else 0.0
        out |= {"gflop": flops / 1e9, "gflops": rate, "of_limit": rate / limit[f"{dtype}_gflops"]}
        out["limit"] = f"matmul {dtype}"
    elif nbytes:
        rate = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        out |= {"gbytes": nbytes / 1e9, "gbps": rate, "of_limit": rate / limit["copy_gbps"]}
        out["limit"] = "copy"
    return out


def plain_step(model: Any, optimizer: Any, rows: list[list[int]], pad: int) -> None:
    """A bare forward, full log-softmax, token-mean loss, backward and AdamW step over
    ``rows`` (:data:`PLAIN_ROWS` rows per pass, gradients accumulate)."""
    total = sum(len(r) - 1 for r in rows)
    for start in range(0, len(rows), PLAIN_ROWS):
        part = rows[start : start + PLAIN_ROWS]
        width = max(len(r) for r in part)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in part])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in part])
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * mask[:, 1:]).sum() / total
        loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _informative(scored: list[Any]) -> list[Any]:
    """The round's groups with rewards alternating 0/1 (every group informative)."""
    return [
        dataclasses.replace(
            g,
            completions=tuple(
                dataclasses.replace(c, reward=float(i % 2)) for i, c in enumerate(g.completions)
            ),
        )
        for g in scored
    ]


def profile_size(size: Size, *, repeats: int, threads: int, limit_repeats: int) -> dict[str, Any]:
    """Every reachable stage of one node-round at ``size`` (see the module docstring),
    beside the limits measured before and after it."""
    spec = NodeSpec.build(
        model=MODEL,
        tasks=["basic_arithmetic"],
        questions_per_round=size.questions,
        completions_per_question=size.completions,
        max_new_tokens=size.new_tokens,
        local=size.questions,
        train_layers=size.train_layers,
    )
    learner = build_learner(spec)
    torch.set_num_threads(threads)
    model, trainer = learner.model, learner.trainer
    trainer.config = trainer.config.replace(micro_batch_tokens=size.micro_batch_tokens)
    arch = Arch.of(model)
    limit = limits(arch.hidden, arch.ff, arch.vocab, tokens=2048, repeats=limit_repeats)
    trained = size.train_layers or arch.layers
    head_trains = size.train_layers is None
    sampler = getattr(learner.generator, "_model", model)
    sampler_dtype = str(next(sampler.parameters()).dtype).removeprefix("torch.")
    stages: dict[str, dict[str, Any]] = {}

    times: dict[str, list[float]] = {}

    def best(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    def timed(name: str, fn: Any) -> Any:
        for _ in range(repeats):
            start = time.perf_counter()
            out = fn()
            best(name, time.perf_counter() - start)
        return out

    groups: list[Any] = timed("generation", lambda: anyio.run(learner.generate))
    with sampler_before_issue_56():
        timed("generation_before", lambda: anyio.run(learner.generate))
    prompt_tokens = sum(len(g.result.prompt_token_ids) for g in groups)
    sampled = sum(len(c.token_ids or ()) for g in groups for c in g.result.completions)
    rows_n = sum(len(g.result.completions) for g in groups)
    mean_ctx = prompt_tokens / len(groups) + size.new_tokens / 2
    gen_flops = (
        prompt_tokens * arch.layers * arch.block  # one prefill per distinct prompt
        + sampled * (arch.layers * (arch.block + 4 * mean_ctx * arch.q_dim) + arch.head)
        + rows_n * arch.head
    )
    scored = timed("scoring", lambda: learner.score_local(groups))
    views = [
        (list(g.result.prompt_token_ids), [list(c.token_ids or ()) for c in g.result.completions])
        for g in groups
    ]
    view_flops = 0
    for prompt, comps in views:
        width = len(prompt) + max(len(c) for c in comps)
        view_flops += arch.blocks(len(comps), width, arch.layers) + len(comps) * width * arch.head
    view_bf16 = trainer.bf16  # the node's view runs in its trainer's precision
    view_today = functools.partial(token_logprobs_batch, bf16=view_bf16)
    for _ in range(repeats):  # the view's path before issue 56 beside today's, alternating
        for name, fn in (("view_logprobs", view_today), ("view_padded", view_padded)):
            start = time.perf_counter()
            [fn(model, *v, pad=0) for v in views]
            best(name, time.perf_counter() - start)
    shared_view_flops = 0
    for prompt, comps in views:
        c_width = max(len(c) for c in comps)
        shared_view_flops += (
            arch.blocks(1, len(prompt), arch.layers)
            + arch.blocks(len(comps), c_width, arch.layers, len(prompt) + c_width)
            + sum(len(c) for c in comps) * arch.head
        )

    batch = _informative(scored)
    cfg = trainer.config
    frozen_passes = int(cfg.ppo_epochs > 1 or cfg.minibatches > 1) + int(cfg.kl_beta > 0)
    flops = {
        shared: step_flops(arch, batch, trained, head_trains, frozen_passes, shared=shared)
        for shared in (False, True)
    }
    rows = [
        list(g.prompt_token_ids or ()) + list(c.token_ids or ())
        for g in batch
        for c in g.completions
    ]
    variants = {v: k for v, k in VARIANTS.items() if _cpu_bf16() or not k["bf16"]}
    base = trainer.config
    plain_opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    step_stages: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    model.train()
    for _ in range(repeats):
        for variant, settings in variants.items():
            trainer.config = base.replace(**settings)
            start = time.perf_counter()
            learner.train(batch)
            best(f"step_{variant}", time.perf_counter() - start)
            for stage, seconds in trainer.stage_seconds.items():
                step_stages[variant].setdefault(stage, []).append(seconds)
        start = time.perf_counter()
        plain_step(model, plain_opt, rows, learner.tokenizer.pad_token_id)
        best("step_plain", time.perf_counter() - start)
    trainer.config = base
    model.eval()
    trained_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    all_params = sum(p.numel() for p in model.parameters())
    timed(
        "weight_sync", lambda: anyio.run(learner.generator.sync_weights, model.named_parameters())
    )
    ckpt_bytes = 0
    for _ in range(repeats):
        directory = Path(tempfile.mkdtemp(prefix="sapo-profile-"))
        try:
            start = time.perf_counter()
            learner.save(directory)
            best("checkpoint", time.perf_counter() - start)
            ckpt_bytes = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    # the limits again after the stages: a machine shared with others drifts, and a limit
    # caught in a busy moment would flatter every stage measured against it
    limit = _higher(
        limit, limits(arch.hidden, arch.ff, arch.vocab, tokens=2048, repeats=limit_repeats)
    )
    low = {name: min(values) for name, values in times.items()}
    stages["generation"] = _stage(
        low["generation"], flops=gen_flops, limit=limit, dtype=sampler_dtype
    )
    stages["scoring"] = _stage(low["scoring"], limit=limit, dtype="float32")
    stages["view_logprobs"] = _stage(
        low["view_logprobs"],
        flops=shared_view_flops,
        limit=limit,
        dtype="bfloat16" if view_bf16 else "float32",
    )
    before = {
        "generation": _stage(
            low["generation_before"], flops=gen_flops, limit=limit, dtype=sampler_dtype
        ),
        "view_logprobs": _stage(low["view_padded"], flops=view_flops, limit=limit, dtype="float32"),
    }
    steps: dict[str, Any] = {}
    adam_bytes = trained_params * 4 * 7
    for variant in variants:
        dtype = "bfloat16" if variants[variant]["bf16"] else "float32"
        counted = flops[variants[variant]["share_prompts"]]
        split = {stage: min(v) for stage, v in step_stages[variant].items()}
        steps[variant] = {
            "seconds": low[f"step_{variant}"],
            "stages": {
                "batch": _stage(split["batch"], limit=limit, dtype=dtype),
                "old_logprobs": _stage(
                    split["old_logprobs"],
                    flops=counted["old_logprobs"],
                    limit=limit,
                    dtype=dtype,
                ),
                "forward": _stage(
                    split["forward"], flops=counted["forward"], limit=limit, dtype=dtype
                ),
                "backward": _stage(
                    split["backward"], flops=counted["backward"], limit=limit, dtype=dtype
                ),
                "optimizer": _stage(
                    split["optimizer"], nbytes=adam_bytes, limit=limit, dtype=dtype
                ),
            },
            "plain_over_product": low["step_plain"] / low[f"step_{variant}"],
        }
    steps["plain"] = _stage(
        low["step_plain"], flops=flops[False]["plain"], limit=limit, dtype="float32"
    )
    stages["weight_sync"] = _stage(
        low["weight_sync"], nbytes=all_params * 6, limit=limit, dtype="float32"
    )
    stages["checkpoint"] = _stage(
        low["checkpoint"], nbytes=ckpt_bytes, limit=limit, dtype="float32"
    )
    every = spec.checkpoint.every_rounds(state_bytes(model))
    shared_stages = ("scoring", "weight_sync")
    common = (
        sum(stages[s]["seconds"] for s in shared_stages) + stages["checkpoint"]["seconds"] / every
    )
    # trainer.config is the node's default again ("auto"): the variant it picks here
    auto = {"bf16": trainer.bf16, "share_prompts": trainer.share_prompts}
    default = next(v for v, k in variants.items() if k == auto)
    round_before = common + sum(before[s]["seconds"] for s in before)
    round_before += steps["float32"]["seconds"]
    round_after = common + stages["generation"]["seconds"] + stages["view_logprobs"]["seconds"]
    round_after += steps[default]["seconds"]
    rows_n, width, comp = _row_shapes(batch)
    return {
        "size": dataclasses.asdict(size),
        "limits": limit,
        "sampler_dtype": sampler_dtype,
        "rows": rows_n,
        "padded_width": width,
        "completion_tokens": comp,
        "sampled_tokens": sampled,
        "generation_tokens_per_s": sampled / low["generation"],
        "trained_params": trained_params,
        "stages": stages,
        "before_issue_56": before,
        "grpo_step": steps,
        "default_step": default,
        "checkpoint_every_rounds": every,
        "round_seconds": {
            "before": round_before,
            "after": round_after,
            "before_over_after": round_before / round_after,
            "counted": "generation, scoring, one group's view per own group, the step, the "
            "weight sync, and the checkpoint over its interval (checkpoint_every_rounds)",
        },
    }


@contextlib.contextmanager
def sampler_before_issue_56() -> Any:
    """The node's sampler as it was before issue 56, while the block runs: each token drawn
    by ``torch.multinomial`` (an exponential per vocabulary entry), and the prefill's last
    position handed to the head as a strided slice (``logits_to_keep=1``), for which torch
    copies the head's weight once per prompt."""
    from sapo_async.policy.generation import sampling

    def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def forward(
        model: Any, *, ids: Any, mask: Any, pos: Any, past: Any, kw: tuple[str, dict[str, Any]]
    ) -> tuple[torch.Tensor, Any]:
        name, extra = kw
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{name: past},
            **extra,
        )
        return out.logits[:, -1, :], out.cache if name == "cache" else out.past_key_values

    today = sampling.draw, sampling._forward
    sampling.draw, sampling._forward = draw, forward  # type: ignore[assignment]
    try:
        yield
    finally:
        sampling.draw, sampling._forward = today  # type: ignore[assignment]


def view_padded(model: Any, prompt: list[int], rows: list[list[int]], *, pad: int) -> list[Any]:
    """The candidate view's log-probs as computed before issue 56: every row padded to
    prompt + completion, full-vocabulary logits at every position."""
    width = len(prompt) + max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(prompt) + len(row)] = torch.tensor([*prompt, *row])
        mask[b, : len(prompt) + len(row)] = 1
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    start = len(prompt) - 1
    return [logp[b, start : start + len(r)] for b, r in enumerate(rows)]


def profile(
    *,
    quick: bool,
    repeats: int,
    threads: int,
    done: Any = None,
    names: tuple[str, ...] = tuple(SIZES),
) -> dict[str, Any]:
    """The profile section of ``bench/results/real.json``: the sizes ``names``, each beside
    the limits measured around it. Quick runs take two repeats too (their sizes are
    small), so the first call's warm-up is not all they show."""
    torch.set_num_threads(threads)
    sizes = QUICK_SIZES if quick else SIZES
    out: dict[str, Any] = {"cpu_bf16_instructions": _cpu_bf16(), "sizes": {}}
    for name, size in ((n, s) for n, s in sizes.items() if n in names):
        print(f"profile {name}: {size}", flush=True)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        load = os.getloadavg()
        out["sizes"][name] = profile_size(
            size, repeats=max(repeats, 2), threads=threads, limit_repeats=3
        ) | {"started": started, "load_avg_at_start": load}
        gc.collect()  # the size's learner, before the next one loads
        if done is not None:
            done(out)  # each size recorded as it completes (the large one runs ~half an hour)
    return out


def print_profile(result: dict[str, Any]) -> None:
    """One line per stage: seconds, and the share of its limit it reached."""

    def line(name: str, stage: dict[str, Any]) -> str:
        share = f"{stage['of_limit']:6.1%} of {stage['limit']}" if "limit" in stage else ""
        return f"  {name:24s} {stage['seconds']:8.3f} s  {share}"

    for name, size in result["sizes"].items():
        limit = size["limits"]
        print(
            f"{name}: {size['rows']} rows x {size['padded_width']} padded, limits "
            f"{limit['float32_gflops']:.0f} / {limit['bfloat16_gflops']:.0f} GFLOP/s fp32 / bf16,"
            f" copy {limit['copy_gbps']:.1f} GB/s"
        )
        for stage, value in size["stages"].items():
            print(line(stage, value))
        for stage, value in size["before_issue_56"].items():
            print(line(f"{stage} (before)", value))
        for variant, step in size["grpo_step"].items():
            if variant == "plain":
                print(line("step plain", step))
                continue
            print(
                f"  step {variant:19s} {step['seconds']:8.3f} s  plain / step "
                f"{step['plain_over_product']:.2f}x"
            )
            for stage, value in step["stages"].items():
                print(line(f"  {stage}", value))
        r = size["round_seconds"]
        print(
            f"  node-round {r['before']:.2f} s before, {r['after']:.2f} s after "
            f"({size['default_step']}): {r['before_over_after']:.2f}x"
        )
