"""Learning benchmark: where a node-round's time goes, on this CPU.

Measures, in one run:

1. the tiny model (CPU preset, both warm-start regimes): per-round time split into
   generation, scoring and training, and generated tokens per second, over real GRPO
   rounds (B = 8 questions x L = 8 completions, one step per round, one torch thread);
2. a randomly initialised model of Qwen2.5-0.5B's exact shape (hidden 896, 24 layers, 14
   heads, 2 KV heads, FFN 4864, vocabulary 151,936, tied embeddings), built from a local
   config with no download: one forward/backward of a GRPO-like batch and a few KV-cache
   decode steps, giving training and generation tokens per second and an extrapolated
   node-round time.

Writes ``bench/results/learning.json``. ``--quick`` (< 1 min) uses tiny models with a
20-step warm start (the same architecture; timing does not depend on skill much) and
fewer rounds; the full run builds/uses the cached regime models (first build: ~3 min).

Run: ``just bench learning [--quick]`` or ``python bench/learning.py [--quick]``.
Absolute times depend on the machine and its load; compare ratios within one run.
"""

# E402: logging is configured before the learning modules are imported (their loggers
# are created at import).
# ruff: noqa: E402

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapo_async.logs import configure_logging

# before the learning modules create their loggers: per-step debug events are not wanted
configure_logging(level="WARNING")

import torch
from results_path import results_path  # bench/ is on sys.path
from transformers import Qwen2Config, Qwen2ForCausalLM

from sapo_async.node.alone import run_alone
from sapo_async.node.learner import Learner, LearnerSettings
from sapo_async.policy.generation.sampling import sample_batch
from sapo_async.policy.grpo import TrainerConfig
from sapo_async.policy.models import load_tiny_model, read_report, tiny_model_dir, tiny_spec
from sapo_async.tasks import TaskSource, preset
from sapo_async.wire import SamplingParams


def bench_tiny(regime: str, rounds: int, quick: bool, cache: Path | None) -> dict[str, Any]:
    overrides: dict[str, Any] = {"warm_steps": 20, "warm_eval_questions": 8} if quick else {}
    spec = tiny_spec(regime, **overrides)
    t0 = time.perf_counter()
    lm = load_tiny_model(spec, cache_dir=cache)
    load_s = time.perf_counter() - t0
    report = read_report(tiny_model_dir(spec, cache))
    node = Learner(
        lm.model,
        lm.tokenizer,
        TaskSource(preset(spec.tasks)),
        LearnerSettings(trainer=TrainerConfig(lr=3e-5)),
        model_id=lm.model_id,
    )
    run_alone(node, 3)  # warm-up: allocator, first-call overheads
    metrics = run_alone(node, rounds)
    gen = [m.generate_s for m in metrics]
    score = [m.score_s for m in metrics]
    train = [m.train_s for m in metrics]
    toks = [m.generated_tokens for m in metrics]
    total = [g + s + t for g, s, t in zip(gen, score, train, strict=True)]
    rewards = [m.reward_mean for m in metrics]
    k = max(1, len(rewards) // 5)
    return {
        "regime": regime,
        "spec_key": spec.key(),
        "params": report.params,
        "warm_start": {
            "steps": report.steps,
            "reward_before": report.reward_before,
            "reward_after": report.reward_after,
            "tag_rate_after": report.tag_rate_after,
            "build_or_load_s": load_s,
        },
        "rounds": rounds,
        "per_round_ms": {
            "generate": 1000 * statistics.mean(gen),
            "score": 1000 * statistics.mean(score),
            "train": 1000 * statistics.mean(train),
            "total": 1000 * statistics.mean(total),
            "total_median": 1000 * statistics.median(total),
        },
        "generated_tokens_per_round": statistics.mean(toks),
        "generated_tokens_per_s": sum(toks) / sum(gen),
        "informative_groups_per_round": statistics.mean(m.informative_local for m in metrics),
        "steps_skipped": sum(bool(m.step["skipped"]) for m in metrics),
        "reward_first_fifth": statistics.mean(rewards[:k]),
        "reward_last_fifth": statistics.mean(rewards[-k:]),
    }


def bench_qwen_shape(quick: bool) -> dict[str, Any]:
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    init_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    # GRPO-like training batch: sequences of prompt + completion, loss on all tokens.
    # On 2 CPU cores a 0.5B model runs ~15 forward tokens/s: keep the batches small.
    seqs, length = (1, 32) if quick else (2, 128)
    ids = torch.randint(0, config.vocab_size, (seqs, length))
    model.train()
    fb: list[float] = []
    for _ in range(1):
        t = time.perf_counter()
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        model.zero_grad(set_to_none=True)
        fb.append(time.perf_counter() - t)
        del logits, logp
    # KV-cache decoding: P prompts x n completions, a few steps.
    model.eval()
    prompts, n, new, plen = (1, 2, 2, 16) if quick else (2, 4, 8, 32)
    prompt_ids = [list(range(100 + i, 100 + plen + i)) for i in range(prompts)]
    t = time.perf_counter()
    out = sample_batch(
        model,
        prompt_ids,
        SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new),
        n=n,
        stop_ids=[-1],
        pad_id=0,
        seed=0,
    )
    gen_s = time.perf_counter() - t
    gen_tokens = sum(len(x) for x in out.token_ids)
    train_tps = seqs * length / min(fb)
    gen_tps = gen_tokens / gen_s
    # A paper-sized node-round: 64 completions of ~256 tokens after ~128-token prompts.
    round_gen_tokens, round_train_tokens = 64 * 256, 64 * (128 + 256)
    return {
        "shape": "Qwen2.5-0.5B (random init, no download)",
        "params": params,
        "init_s": init_s,
        "train_batch": {"sequences": seqs, "tokens_per_sequence": length},
        "forward_backward_s": min(fb),
        "train_tokens_per_s": train_tps,
        "generate": {
            "prompts": prompts,
            "prompt_tokens": plen,
            "n": n,
            "new_tokens": new,
            "seconds": gen_s,
        },
        "generated_tokens_per_s": gen_tps,
        "extrapolated_node_round_s": {
            "assumption": "64 completions x 256 new tokens, 128-token prompts, batched as here",
            "generate": round_gen_tokens / gen_tps,
            "train": round_train_tokens / train_tps,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="under a minute")
    parser.add_argument("--out", type=Path, default=None, help="default: results_path()")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the tiny model")
    parser.add_argument("--no-qwen", action="store_true", help="skip the 0.5B-shape part")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cache: Path | None = None
    tmp = None
    if args.quick:
        tmp = tempfile.TemporaryDirectory(prefix="sapo-bench-")
        cache = Path(tmp.name)
    rounds = 20 if args.quick else 100
    result: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "tiny_threads": args.threads,
            "load_avg_at_start": os.getloadavg(),
        },
        "quick": args.quick,
        "tiny": {},
    }
    for regime in ("sparse", "dense"):
        r = bench_tiny(regime, rounds, args.quick, cache)
        result["tiny"][regime] = r
        pr = r["per_round_ms"]
        print(
            f"tiny/{regime}: {pr['total']:.0f} ms/round (gen {pr['generate']:.0f}, "
            f"score {pr['score']:.1f}, train {pr['train']:.0f}); "
            f"{r['generated_tokens_per_s']:.0f} generated tok/s; reward "
            f"{r['reward_first_fifth']:.3f} -> {r['reward_last_fifth']:.3f}",
            flush=True,
        )
    if not args.no_qwen:
        torch.set_num_threads(os.cpu_count() or 1)
        q = bench_qwen_shape(args.quick)
        q["threads"] = torch.get_num_threads()
        result["qwen2.5_0.5b_shape"] = q
        print(
            f"qwen2.5-0.5b shape ({q['params'] / 1e6:.0f} M params): fwd+bwd "
            f"{q['train_tokens_per_s']:.0f} tok/s, decode {q['generated_tokens_per_s']:.1f} tok/s",
            flush=True,
        )
    result["wall_s"] = time.perf_counter() - started
    out = args.out or results_path("learning", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
