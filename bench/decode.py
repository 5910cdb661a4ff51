"""Decode speed of the transformers generation path on a Qwen2.5-0.5B-shaped model.

Answers two questions about ``sapo_async.policy.generation.sampling.sample_batch``:

1. Does it use its KV cache? It checks that the cache grows by one position per step and
   that a cached step gives the logits a full recompute gives.
2. What does projecting only the last position onto the vocabulary (``logits_to_keep=1``)
   buy? The "before" runs the same loop with every position projected, as main did; the
   two run alternately, ``--repeats`` times each, and the best of each is kept, so machine
   load hits both alike.

The model is randomly initialised with Qwen2.5-0.5B's exact shape (vocabulary 151,936,
width 896, 24 layers); nothing is downloaded. Results go to ``bench/results/decode.json``
(``--quick``: a 2-layer model, ``bench/results/quick/``).

    just bench decode [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from bench.results_path import results_path
from sapo_async.policy.generation import sampling
from sapo_async.wire import SamplingParams


def _model(layers: int) -> Any:
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


@torch.inference_mode()
def check_cache(model: Any) -> dict[str, Any]:
    """The cache grows one position per step and a cached step equals a full recompute."""
    kw = sampling._forward_kwargs(model)
    ids = torch.randint(0, 1000, (2, 12))
    mask = torch.ones_like(ids)
    pos = torch.arange(12)[None].expand(2, -1)
    _, past = sampling._forward(model, ids=ids, mask=mask, pos=pos, past=None, kw=kw)
    lengths = [past.get_seq_length()]
    nxt = torch.randint(0, 1000, (2, 1))
    mask2 = torch.ones(2, 13, dtype=torch.long)
    cached, past = sampling._forward(
        model, ids=nxt, mask=mask2, pos=torch.full((2, 1), 12), past=past, kw=kw
    )
    lengths.append(past.get_seq_length())
    full = model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -1]
    return {
        "cache_kwarg": kw[0],
        "cache_lengths": lengths,
        "max_abs_diff_cached_vs_full": float((cached - full).abs().max()),
    }


@torch.inference_mode()
def time_prefill(model: Any, plen: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds of one prefill (2 prompts of ``plen`` tokens), with every
    position projected onto the vocabulary (before) and only the last (after), alternating."""
    ids = torch.randint(0, 1000, (2, plen))
    mask = torch.ones_like(ids)
    pos = torch.arange(plen)[None].expand(2, -1)
    name, keep_last = sampling._forward_kwargs(model)
    best: dict[str, float] = {}
    for _ in range(repeats):
        for label, extra in (("before", {}), ("after", keep_last)):
            t = time.perf_counter()
            sampling._forward(model, ids=ids, mask=mask, pos=pos, past=None, kw=(name, extra))
            best[label] = min(best.get(label, float("inf")), time.perf_counter() - t)
    return best


def _run(model: Any, prompts: int, n: int, plen: int, new: int) -> tuple[float, int]:
    prompt_ids = [list(range(100 + i, 100 + plen + i)) for i in range(prompts)]
    t = time.perf_counter()
    out = sampling.sample_batch(
        model,
        prompt_ids,
        SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new),
        n=n,
        stop_ids=[-1],
        pad_id=0,
        seed=0,
    )
    return time.perf_counter() - t, sum(len(x) for x in out.token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 2-layer model, one repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (Qwen2.5-0.5B: 24)")
    parser.add_argument(
        "--prefill-only",
        action="store_true",
        help="time only the prefill, where the change acts (the least noisy comparison)",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results_path()")
    args = parser.parse_args()
    layers = 2 if args.quick else args.layers
    repeats = 1 if args.quick else args.repeats
    prompts, n, plen, new = (2, 4, 128, 16)
    model = _model(layers)
    result: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "load_avg_at_start": os.getloadavg(),
            "note": "shared machine (other jobs running); compare the two variants only",
        },
        "model": {"shape": "Qwen2.5-0.5B", "layers": layers, "vocab": 151936, "hidden": 896},
        "batch": {"prompts": prompts, "n": n, "prompt_tokens": plen, "new_tokens": new},
        "cache": check_cache(model),
    }
    result["prefill_s"] = time_prefill(model, plen, max(repeats, 2))
    print(f"prefill: {result['prefill_s']}", flush=True)
    if args.prefill_only:
        out = args.out or results_path("decode", quick=args.quick)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {out}")
        return
    keep_last = sampling._forward_kwargs

    def project_all(m: Any) -> tuple[str, dict[str, Any]]:
        return keep_last(m)[0], {}

    best: dict[str, float] = {}
    tokens = 0
    for _ in range(repeats):
        for name, kwargs in (("before", project_all), ("after", keep_last)):
            sampling._forward_kwargs = kwargs  # type: ignore[assignment]
            try:
                seconds, tokens = _run(model, prompts, n, plen, new)
            finally:
                sampling._forward_kwargs = keep_last  # type: ignore[assignment]
            best[name] = min(best.get(name, float("inf")), seconds)
            print(f"{name}: {seconds:.1f} s for {tokens} tokens", flush=True)
    result["seconds"] = best
    result["generated_tokens"] = tokens
    result["tokens_per_s_before"] = tokens / best["before"]
    result["tokens_per_s"] = tokens / best["after"]
    out = args.out or results_path("decode", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(
        f"decode {result['tokens_per_s_before']:.2f} -> {result['tokens_per_s']:.2f} tok/s "
        f"(cache {result['cache']}); wrote {out}"
    )


if __name__ == "__main__":
    main()
