"""GPU check: generation throughput, GRPO-like step times and peak memory on one GPU.

One run of at most ``--minutes`` (default 8) on one GPU, with no downloads: a randomly
initialised model of Qwen2.5-0.5B's exact shape (hidden 896, 24 layers, 14 heads, 2 KV
heads, FFN 4864, vocabulary 151,936, tied embeddings) built from a local config, and a
byte-level tokenizer built here with ``tokenizers`` (every byte is a token; the rest of the
151,936 ids are fixed 3-character strings, so anything the random model samples decodes).

Phases:
    1. transformers on CUDA: a few rounds of 8 questions x 8 completions, each followed by
       one policy-gradient step (group-normalised advantages, clip 0.2 / 0.28, no KL).
    1b. the project's GRPO trainer (``sapo_async.policy.grpo.Trainer``), one step on 8 x 8
       completions of 512 tokens with the settings a node gets from its ``NodeSpec``:
       chunked completion-token log-probs, micro-batches, bf16, activation checkpointing.
       Reports peak memory and ``completion_tokens_trained`` (it must equal 512).
    2. vLLM (only if ``vllm`` is importable): the project's own ``VllmGenerator``,
       colocated with the trainer; per round generate, sleep (level 1), train, wake with
       the new weights synced in memory through CUDA IPC, probe. Then a deliberately
       corrupted sync, which the probe must reject.

Prints and writes ``bench/results/gpu.json``: generated tokens/s, step and sync times,
probe mismatches, peak GPU memory, the trainer step's memory and completion tokens.

Wheels: phase 1 needs only torch (CUDA build), transformers and tokenizers (safetensors
comes with transformers). Phase 1b imports this repository's trainer, and phase 2 also
needs ``vllm==0.33.0``, with this repository's light runtime deps (anyio, msgspec,
eth-hash[pycryptodome], structlog); ``pip install -e .[gpu]`` covers all of it.
Run from the repository root::

    python bench/gpu_check.py                   # on a GPU machine
    python bench/gpu_check.py --arch smollm2-135m   # SmolLM2's Llama architecture
    python bench/gpu_check.py --cpu-smoke --out /tmp/gpu.json   # CPU, tiny model, seconds

``--cpu-smoke`` runs phase 1 on CPU with a tiny model of the same family (used by the tests).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import platform
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

QWEN25_05B_SHAPE: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "vocab_size": 151_936,
}
"""Qwen/Qwen2.5-0.5B-Instruct's config.json values that set its shape."""

SMOLLM2_135M_SHAPE: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rope_theta": 100_000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "vocab_size": 49_152,
}
"""SmolLM2-135M-Instruct's shape (a Llama), as the packaged model's config.json says
(``sapo-async warmstart --models smollm2-135m`` writes it; read from there when present)."""

ARCHES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": ("qwen2", QWEN25_05B_SHAPE),
    "smollm2-135m": ("llama", SMOLLM2_135M_SHAPE),
}
"""``--arch``: the model family and shape the check builds (random weights, no download)."""

SMOKE_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "vocab_size": 512,
}
"""A model of the same family small enough for a CPU smoke run in seconds."""

EOS = "<|endoftext|>"
CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer of exactly ``vocab_size`` ids, built offline.

    Id 0 is the end-of-text token, ids 1..256 the 256 byte symbols (every text encodes,
    one token per byte), the rest fixed 3-character strings that are never produced by
    encoding but decode to text, so a random model's samples are always decodable.
    """
    if vocab_size < 258:
        raise ValueError(f"vocab_size must be >= 258, got {vocab_size}")
    vocab: dict[str, int] = {EOS: 0}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    fillers = itertools.product(string.ascii_letters + string.digits, repeat=3)
    while len(vocab) < vocab_size:
        vocab["".join(next(fillers))] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            pre_tokenizers.Split(Regex("."), behavior="isolated"),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def build_model(shape: dict[str, Any], *, seed: int, family: str = "qwen2") -> Any:
    """A randomly initialised causal LM of ``family`` (qwen2 or llama) and ``shape``
    (float32, on CPU)."""
    torch.manual_seed(seed)
    if family == "llama":
        return LlamaForCausalLM(
            LlamaConfig(**shape, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        )
    config = Qwen2Config(**shape, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return Qwen2ForCausalLM(config)


def arch_shape(arch: str) -> tuple[str, dict[str, Any]]:
    """``arch``'s family and shape; SmolLM2's from the prepared packaged model if present."""
    family, shape = ARCHES[arch]
    if arch == "smollm2-135m":
        try:
            from sapo_async.policy.models.packaged import packaged_model_dir

            config = json.loads((packaged_model_dir(arch) / "config.json").read_text())
            shape = {**shape, **{k: config[k] for k in shape if k in config}}
            shape["rope_theta"] = config.get("rope_parameters", {}).get(
                "rope_theta", shape["rope_theta"]
            )
        except (ImportError, OSError, ValueError):
            pass  # not prepared here (a GPU machine without the wheel): the recorded shape
    return family, dict(shape)


def save_checkpoint(model: Any, tokenizer: PreTrainedTokenizerFast, path: Path) -> Path:
    """Write a loadable model directory (config, safetensors, tokenizer) to ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def questions(count: int, round_index: int) -> list[str]:
    """Deterministic arithmetic prompts, different each round."""
    out = []
    for i in range(count):
        a, b = (round_index * 31 + i * 7) % 90 + 10, (round_index * 17 + i * 13) % 90 + 10
        out.append(f"Question: what is {a} + {b}? Answer with a number.\nAnswer:")
    return out


def reward(text: str) -> float:
    """A cheap verifiable-looking reward: the share of digits in the completion."""
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO advantages: reward minus group mean, over group std (0 when all equal)."""
    out: list[float] = []
    for start in range(0, len(rewards), group):
        chunk = rewards[start : start + group]
        mean = sum(chunk) / len(chunk)
        std = math.sqrt(sum((r - mean) ** 2 for r in chunk) / len(chunk))
        out.extend((r - mean) / (std + 1e-4) if std > 0 else 0.0 for r in chunk)
    return out


def policy_gradient_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    samples: list[tuple[list[int], list[int], list[float], float]],
    *,
    device: torch.device,
    micro_batch: int,
) -> float:
    """One GRPO step without KL: clipped ratio objective, token-mean aggregation.

    ``samples`` holds ``(prompt_ids, completion_ids, old_logprobs, advantage)``.
    Returns the loss value.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_tokens = sum(len(c) for _, c, _, _ in samples) or 1
    loss_value = 0.0
    for start in range(0, len(samples), micro_batch):
        batch = samples[start : start + micro_batch]
        length = max(len(p) + len(c) for p, c, _, _ in batch)
        ids = torch.zeros((len(batch), length), dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.bool)
        old = torch.zeros((len(batch), length))
        adv = torch.zeros((len(batch), length))
        for row, (p, c, lp, a) in enumerate(batch):
            seq = p + c
            ids[row, : len(seq)] = torch.tensor(seq)
            # position t predicts token t + 1; completion tokens start at len(p)
            mask[row, len(p) - 1 : len(seq) - 1] = True
            old[row, len(p) - 1 : len(seq) - 1] = torch.tensor(lp)
            adv[row, len(p) - 1 : len(seq) - 1] = a
        ids, mask, old, adv = ids.to(device), mask.to(device), old.to(device), adv.to(device)
        with torch.autocast(
            device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
        ):
            logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
        m, o, a = mask[:, :-1], old[:, :-1], adv[:, :-1]
        ratio = torch.exp(logp - o)
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * a)
        loss = -(surrogate * m).sum() / total_tokens
        loss.backward()
        loss_value += float(loss)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss_value


def hf_generate(
    model: Any,
    tokenizer: PreTrainedTokenizerFast,
    prompts: list[str],
    *,
    n: int,
    max_new_tokens: int,
    device: torch.device,
    seed: int,
) -> list[tuple[list[int], list[int], list[float], str]]:
    """Sample ``n`` completions per prompt with transformers' ``generate``.

    Returns ``(prompt_ids, completion_ids, logprobs, text)`` per completion, prompt-major;
    log-probs are temperature-1 log-softmax of the raw logits, as the port requires.
    """
    model.eval()
    torch.manual_seed(seed)
    out: list[tuple[list[int], list[int], list[float], str]] = []
    for prompt in prompts:
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        input_ids = torch.tensor([prompt_ids], device=device)
        with (
            torch.inference_mode(),
            torch.autocast(
                device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
            ),
        ):
            gen = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,  # transformers defaults to 50; the node's "off" is explicit
                max_new_tokens=max_new_tokens,
                num_return_sequences=n,
                return_dict_in_generate=True,
                output_logits=True,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        steps = torch.stack(gen.logits, dim=1).float()  # (n, new, vocab)
        new_tokens = gen.sequences[:, len(prompt_ids) :]
        logprobs = torch.log_softmax(steps, -1).gather(2, new_tokens.unsqueeze(2)).squeeze(2)
        for row in range(n):
            ids = new_tokens[row].tolist()
            if tokenizer.eos_token_id in ids:
                ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
            lps = logprobs[row, : len(ids)].tolist()
            text = tokenizer.decode(ids, skip_special_tokens=True)
            out.append((prompt_ids, ids, lps, text))
    return out


def _memory_gib(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info()
    return {
        "trainer_peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "device_used_gib": round((total - free) / 2**30, 3),
        "device_total_gib": round(total / 2**30, 3),
    }


def run_transformers_phase(
    model: Any,
    tokenizer: PreTrainedTokenizerFast,
    *,
    device: torch.device,
    rounds: int,
    questions_per_round: int,
    completions: int,
    max_new_tokens: int,
    deadline: float,
) -> dict[str, Any]:
    """Phase 1: transformers generation + a GRPO-like step per round."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        samples = hf_generate(
            model,
            tokenizer,
            questions(questions_per_round, r),
            n=completions,
            max_new_tokens=max_new_tokens,
            device=device,
            seed=r,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        gen_s = time.perf_counter() - t0
        tokens = sum(len(c) for _, c, _, _ in samples)
        rewards = [reward(text) for *_, text in samples]
        advantages = group_advantages(rewards, completions)
        t1 = time.perf_counter()
        loss = policy_gradient_step(
            model,
            optimizer,
            [(p, c, lp, a) for (p, c, lp, _), a in zip(samples, advantages, strict=True)],
            device=device,
            micro_batch=16,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t1
        per_round.append(
            {
                "round": r,
                "generate_s": round(gen_s, 4),
                "generated_tokens": tokens,
                "tokens_per_s": round(tokens / gen_s, 1),
                "train_step_s": round(step_s, 4),
                "loss": loss,
                "mean_reward": sum(rewards) / len(rewards),
            }
        )
        print(f"[transformers] round {r}: {per_round[-1]}", flush=True)
    return {"rounds": per_round, **_summary(per_round), **_memory_gib(device)}


def run_trainer_phase(
    model: Any,
    *,
    device: torch.device,
    questions_per_round: int,
    completions: int,
    max_new_tokens: int,
    prompt_tokens: int,
) -> dict[str, Any]:
    """Phase 1b: one step of the project's own GRPO trainer at full completion length.

    Every completion runs to ``max_new_tokens`` (random ids, behaviour log-probs, TIS on),
    and the trainer's settings come from a ``NodeSpec`` as a node's do: completion-token
    log-probs in vocabulary chunks, micro-batches, and on CUDA bf16 autocast and activation
    checkpointing. Reports peak memory, step time and the completion tokens trained.
    """
    from sapo_async.policy.grpo import ScoredCompletion, ScoredGroup, Trainer, TrainerConfig
    from sapo_async.policy.grpo.batch import TokenSource
    from sapo_async.policy.models import tokenizer_id, train_char_tokenizer

    cuda = device.type == "cuda"
    config = TrainerConfig(
        lr=1e-6,
        tis_cap=2.0,
        max_completion_tokens=max_new_tokens,  # one completion length
        micro_batch_tokens=16384 if cuda else 512,
        gradient_checkpointing=cuda,
        bf16=cuda,
    )
    tok = train_char_tokenizer(["0123456789 abcdefghijklmnopqrstuvwxyz"])
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    groups = [
        ScoredGroup(
            prompt=f"q{q}",
            prompt_token_ids=tuple(
                torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()
            ),
            tokenizer_id=tokenizer_id(tok),
            completions=tuple(
                ScoredCompletion(
                    f"c{c}",
                    float(c % 2),
                    "length",
                    tuple(torch.randint(0, vocab, (max_new_tokens,), generator=gen).tolist()),
                    tuple([-11.0] * max_new_tokens),
                )
                for c in range(completions)
            ),
            token_source=TokenSource.SAMPLED,
        )
        for q in range(questions_per_round)
    ]
    trainer = Trainer(model, tok, config, add_special_tokens=False)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    m = trainer.step(groups)
    if cuda:
        torch.cuda.synchronize()
    # the candidate view's log-probs (node/plausibility.py) on the model's device
    from sapo_async.node.plausibility import token_logprobs_batch

    first = groups[0]
    view = token_logprobs_batch(
        model,
        list(first.prompt_token_ids or ()),
        [list(c.token_ids or ()) for c in first.completions],
        pad=0,
    )
    return {
        "view_logprobs_device": sorted({str(v.device) for v in view}),
        "view_logprobs_finite": all(bool(torch.isfinite(v).all()) for v in view),
        "step_s": round(time.perf_counter() - t, 3),
        "sequences": m.sequences,
        "completion_tokens_trained": m.tokens // max(m.sequences, 1),
        "max_new_tokens": max_new_tokens,
        "loss": m.loss,
        "grad_norm": m.grad_norm,
        "micro_batch_tokens": config.micro_batch_tokens,
        "bf16": config.bf16,
        "gradient_checkpointing": config.gradient_checkpointing,
        **_memory_gib(device),
    }


def _summary(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    if not per_round:
        return {"skipped": "time budget spent before the first round"}
    later = per_round[1:] or per_round  # round 0 includes warm-up
    return {
        "tokens_per_s_mean": round(sum(r["tokens_per_s"] for r in later) / len(later), 1),
        "train_step_s_mean": round(sum(r["train_step_s"] for r in later) / len(later), 4),
    }


def run_vllm_phase(
    model: Any,
    checkpoint: Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    device: torch.device,
    rounds: int,
    questions_per_round: int,
    completions: int,
    max_new_tokens: int,
    deadline: float,
    gpu_memory_utilization: float,
) -> dict[str, Any]:
    """Phase 2: the project's VllmGenerator colocated with the trainer."""
    # Phase 2 only: the script's top-level imports stay torch/transformers/tokenizers.
    import anyio

    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from sapo_async.errors import WeightSyncError
    from sapo_async.policy.generation.vllm_backend import VllmGenerator, VllmSettings
    from sapo_async.wire import SamplingParams

    settings = VllmSettings(
        model=str(checkpoint),
        gpu_memory_utilization=gpu_memory_utilization,
        dtype="bfloat16",
        sleep_level=1,
        enforce_eager=True,  # CUDA-graph capture would eat a minute of the budget
        max_model_len=1024,
    )
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    async def body() -> dict[str, Any]:
        t0 = time.perf_counter()
        gen = await VllmGenerator.create(settings, trainer_model=model)
        startup_s = time.perf_counter() - t0
        initial = await gen.probe()
        per_round: list[dict[str, Any]] = []
        try:
            for r in range(rounds):
                if time.monotonic() > deadline:
                    break
                prompts = questions(questions_per_round, r)
                t1 = time.perf_counter()
                results = await gen.generate(prompts, sampling, n=completions, seed=r)
                gen_s = time.perf_counter() - t1
                samples = [
                    (
                        list(res.prompt_token_ids),
                        list(c.token_ids or ()),
                        list(c.logprobs or ()),
                        c.text,
                    )
                    for res in results
                    for c in res.completions
                ]
                tokens = sum(len(c) for _, c, _, _ in samples)
                rewards = [reward(text) for *_, text in samples]
                advantages = group_advantages(rewards, completions)
                t2 = time.perf_counter()
                await gen.sleep()
                sleep_s = time.perf_counter() - t2
                t3 = time.perf_counter()
                loss = policy_gradient_step(
                    model,
                    optimizer,
                    [(p, c, lp, a) for (p, c, lp, _), a in zip(samples, advantages, strict=True)],
                    device=device,
                    micro_batch=16,
                )
                torch.cuda.synchronize()
                step_s = time.perf_counter() - t3
                t4 = time.perf_counter()
                await gen.wake_up(model.named_parameters(), policy_version=r + 1)
                sync_s = time.perf_counter() - t4
                probe = gen.last_probe
                assert probe is not None
                per_round.append(
                    {
                        "round": r,
                        "generate_s": round(gen_s, 4),
                        "generated_tokens": tokens,
                        "tokens_per_s": round(tokens / gen_s, 1),
                        "sleep_s": round(sleep_s, 4),
                        "train_step_s": round(step_s, 4),
                        "wake_sync_probe_s": round(sync_s, 4),
                        "probe_mean_abs_diff": probe.mean_abs_diff,
                        "probe_max_abs_diff": probe.max_abs_diff,
                        "loss": loss,
                        **_memory_gib(device),
                    }
                )
                print(f"[vllm] round {r}: {per_round[-1]}", flush=True)
            # A corrupted sync must be caught by the probe, then a good sync must pass.
            noise = torch.Generator(device=device).manual_seed(0)
            corrupted = [
                (name, p.detach() + 0.05 * torch.randn(p.shape, generator=noise, device=device))
                for name, p in model.named_parameters()
            ]
            try:
                await gen.sync_weights(corrupted)
                rejected, bad_diff = False, None
            except WeightSyncError as exc:
                rejected, bad_diff = True, exc.mismatch
            del corrupted
            await gen.sync_weights(model.named_parameters())
            restored = gen.last_probe
        finally:
            await gen.aclose()
        return {
            "startup_s": round(startup_s, 2),
            "initial_probe_mean_abs_diff": initial.mean_abs_diff,
            "corrupted_sync_rejected": rejected,
            "corrupted_sync_mean_abs_diff": bad_diff,
            "restored_probe_mean_abs_diff": restored.mean_abs_diff if restored else None,
            "rounds": per_round,
            **_summary(per_round),
        }

    return anyio.run(body)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the check and write the JSON report. Returns the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU, seconds")
    parser.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per phase")
    parser.add_argument("--skip-vllm", action="store_true", help="run only the transformers phase")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.25)
    parser.add_argument(
        "--arch", choices=sorted(ARCHES), default="qwen2.5-0.5b", help="model shape to build"
    )
    args = parser.parse_args(argv)

    started = time.monotonic()
    deadline = started + args.minutes * 60 * 0.85  # leave room to write the report
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        parser.error("no CUDA device; use --cpu-smoke for the CPU smoke run")
    device = torch.device("cpu" if smoke else "cuda")
    if smoke:
        torch.set_num_threads(min(2, torch.get_num_threads()))
    family, shape = arch_shape(args.arch)
    if smoke:
        shape = SMOKE_SHAPE
    rounds = args.rounds if args.rounds is not None else (2 if smoke else 3)
    questions_per_round, completions = (2, 4) if smoke else (8, 8)
    max_new_tokens = 16 if smoke else 256

    tokenizer = build_tokenizer(shape["vocab_size"])
    model = build_model(shape, seed=0, family=family)
    report: dict[str, Any] = {
        "arch": args.arch,
        "mode": "cpu-smoke" if smoke else "gpu",
        "device": torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": importlib.import_module("transformers").__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "shape": shape,
        "questions_per_round": questions_per_round,
        "completions_per_question": completions,
        "max_new_tokens": max_new_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        checkpoint = save_checkpoint(model, tokenizer, Path(tmp) / "model")
        model.to(device)
        report["transformers"] = run_transformers_phase(
            model,
            tokenizer,
            device=device,
            rounds=rounds,
            questions_per_round=questions_per_round,
            completions=completions,
            max_new_tokens=max_new_tokens,
            deadline=deadline,
        )
        if time.monotonic() < deadline:
            report["trainer"] = run_trainer_phase(
                model,
                device=device,
                questions_per_round=questions_per_round,
                completions=completions,
                max_new_tokens=16 if smoke else 512,
                prompt_tokens=8 if smoke else 128,
            )
            print(f"[trainer] {report['trainer']}", flush=True)
        else:
            report["trainer"] = {"skipped": "time budget spent"}
        has_vllm = importlib.util.find_spec("vllm") is not None
        if smoke or args.skip_vllm or not has_vllm:
            why = (
                "cpu smoke" if smoke else "--skip-vllm" if args.skip_vllm else "vllm not importable"
            )
            report["vllm"] = {"skipped": why}
        else:
            report["vllm_version"] = importlib.import_module("vllm").__version__
            # Fresh weights from the checkpoint, so the engine and trainer start equal.
            trainer = AutoModelForCausalLM.from_pretrained(checkpoint).to(device)
            del model
            torch.cuda.empty_cache()
            try:
                report["vllm"] = run_vllm_phase(
                    trainer,
                    checkpoint,
                    tokenizer,
                    device=device,
                    rounds=rounds,
                    questions_per_round=questions_per_round,
                    completions=completions,
                    max_new_tokens=max_new_tokens,
                    deadline=deadline,
                    gpu_memory_utilization=args.gpu_memory_utilization,
                )
            except Exception as exc:  # report what broke; the JSON is the point of the run
                report["vllm"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["wall_s"] = round(time.monotonic() - started, 2)
    # A CPU smoke run never writes over a recorded GPU result (bench/results_path.py).
    results = REPO_ROOT / "bench" / "results"
    name = "gpu.json" if args.arch == "qwen2.5-0.5b" else f"gpu-{args.arch}.json"
    args.out = args.out or (results / "quick" if args.cpu_smoke else results) / name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "shape"}, indent=2, default=str))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
