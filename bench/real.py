"""A real model on a CPU: SmolLM2-135M-Instruct's generation and training step through the
product's own path, side by side with what a CPU user would otherwise pick.

Generation, the same prompts (reasoning-gym basic_arithmetic questions in the instruct
style through the model's chat template) and the same number of new tokens per completion
(EOS suppressed everywhere, so every variant produces exactly P x n x new tokens):

* ``product``: the node's sampler (``sampling.sample_batch``: one batched prefill, KV cache,
  last-position logits only, inference mode), float32, as a node runs it;
* ``product_bf16``: the same sampler on a bfloat16 copy of the weights;
* ``generate``: plain ``transformers`` ``model.generate`` on the same batch (sampling,
  KV cache, float32);
* ``llama_cpp``: llama.cpp (``llama-cpp-python``) on the packaged Q4_1 GGUF itself,
  one completion at a time (its Python API does not batch), when installed
  (``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON" pip install llama-cpp-python``: an
  sdist that builds for tens of minutes here, so it is a bench-only install, never in CI;
  the native build dies with an illegal instruction in these VMs).

Training, the same batch of P groups x n completions (rewards alternating 0/1 so every
group is informative): ``product`` is ``Learner.train`` (the GRPO step a node takes with
its default settings: on a CPU with bf16 instructions the bf16 shared-prompt step),
``plain`` a bare forward, mean token log-prob loss, backward and AdamW step of the same
padded batch (a lower bound on any GRPO step).

Then the profile (``bench/real_profile.py``): every stage of a node-round at the
real-model table's size and a larger one, the GRPO step split into its stages, each against
this machine's matmul and copy throughput measured in the same run.

Every variant runs ``--repeats`` times, alternating, best of each kept, so machine load hits
them alike; the ratios are the result, absolute times drift. Full results go to
``bench/results/real.json``, ``--quick`` to ``bench/results/quick/real.json``.

    just bench real [--quick] [--only compare|profile] [--sizes table|large]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from real_profile import plain_step, print_profile, profile
from results_path import results_path  # bench/ is on sys.path when run as a script

from sapo_async.node.learner import build_learner
from sapo_async.node.spec import NodeSpec
from sapo_async.policy.generation import sampling
from sapo_async.policy.models.packaged import PACKAGED_MODELS, gguf_path
from sapo_async.wire import SamplingParams

MODEL = "smollm2-135m"


def _time(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _product(model: Any, prompts: list[list[int]], n: int, new: int) -> int:
    out = sampling.sample_batch(
        model,
        prompts,
        SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new),
        n=n,
        stop_ids=[-1],  # no stop: exactly `new` tokens each
        pad_id=0,
        seed=0,
    )
    return sum(len(ids) for ids in out.token_ids)


@torch.inference_mode()
def _generate(model: Any, tokenizer: Any, prompts: list[list[int]], n: int, new: int) -> int:
    rows = [p for p in prompts for _ in range(n)]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=new,
        min_new_tokens=new,
        pad_token_id=pad,
    )
    return int(out[:, width:].numel())


def _llama(llm: Any, prompts: list[list[int]], n: int, new: int) -> int:
    eos = llm.token_eos()
    tokens = 0
    for prompt in prompts:
        for i in range(n):
            out = llm.create_completion(
                prompt,
                max_tokens=new,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                seed=i,
                logit_bias={eos: -1e9},
            )
            tokens += int(out["usage"]["completion_tokens"])
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 prompt x 2 x 8 tokens, once")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=None, help="default: results_path()")
    parser.add_argument(
        "--only",
        choices=("all", "compare", "profile"),
        default="all",
        help="compare: the generation and training comparisons; profile: the per-stage "
        "profile at the table's and the large size (bench/real_profile.py); the other "
        "part of an existing results file is kept",
    )
    parser.add_argument(
        "--sizes",
        default="table,large",
        help="the profile's sizes to run (table, large); the others' records are kept",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or results_path("real", quick=args.quick)
    result: dict[str, Any] = {}
    if args.only != "profile":
        result = {"machine": _machine(args.threads), "compare": {}}
        for name, dims in (QUICK_COMPARE if args.quick else COMPARE).items():
            # the training comparison at the table's size only: the profile has both
            result["compare"][name] = _compare(args, *dims, train=name == "table")
            print(json.dumps(result["compare"][name]["generation"], indent=1))
            _write(out, _merge(args, out, result))
    if args.only != "compare":
        result["profile"] = _profile(args, result, out)
        print_profile(result["profile"])
    _write(out, _merge(args, out, result))


COMPARE = {"table": (4, 4, 32), "large": (8, 8, 128)}
"""Prompts x completions x new tokens of each comparison: the profile's two sizes."""
QUICK_COMPARE = {"table": (1, 2, 8)}


def _compare(
    args: argparse.Namespace, prompts_n: int, n: int, new: int, *, train: bool
) -> dict[str, Any]:
    """Generation (and with ``train`` the training step), the product against the
    alternatives, at ``prompts_n`` x ``n`` completions of ``new`` tokens (the large size
    once: plain ``generate`` and llama.cpp take minutes a pass there)."""
    repeats = 1 if args.quick or prompts_n * n > 16 else args.repeats
    spec = NodeSpec.build(
        model=MODEL,
        tasks=["basic_arithmetic"],
        questions_per_round=prompts_n,
        completions_per_question=n,
        max_new_tokens=new,
        local=prompts_n,
    )
    learner = build_learner(spec)
    model, tokenizer = learner.model, learner.tokenizer
    groups = anyio.run(learner.generate)
    prompts = [list(g.result.prompt_token_ids) for g in groups]
    result: dict[str, Any] = {
        "model": {
            "name": MODEL,
            "model_id": PACKAGED_MODELS[MODEL].model_id,
            "sha256": PACKAGED_MODELS[MODEL].sha256,
            "params": sum(p.numel() for p in model.parameters()),
            "dtype": "float32 (dequantised from Q4_1); llama.cpp runs the Q4_1 file itself",
        },
        "sizes": {
            "prompts": prompts_n,
            "completions_per_prompt": n,
            "new_tokens": new,
            "prompt_tokens": [len(p) for p in prompts],
            "repeats": repeats,
        },
    }
    model.eval()
    bf16 = None if args.quick else _bf16_copy(model)
    llm = _llama_cpp(args.threads)
    gen: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        variants: dict[str, Any] = {
            "product": lambda: _product(model, prompts, n, new),
            "generate": lambda: _generate(model, tokenizer, prompts, n, new),
        }
        if bf16 is not None:
            variants["product_bf16"] = lambda: _product(bf16, prompts, n, new)
        if llm is not None:
            variants["llama_cpp"] = lambda: _llama(llm, prompts, n, new)
        for name, run in variants.items():
            seconds, count = _time(run)
            gen[name] = min(gen.get(name, float("inf")), seconds)
            tokens[name] = count
            print(f"generate {name}: {seconds:.1f} s, {count} tokens", flush=True)
    result["generation"] = {
        name: {
            "seconds": gen[name],
            "tokens": tokens[name],
            "tokens_per_s": tokens[name] / gen[name],
        }
        for name in gen
    }
    result["generation_ratio_to_generate"] = {name: gen["generate"] / gen[name] for name in gen}
    if llm is None:
        result["llama_cpp"] = (
            'not installed: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON" '
            "pip install llama-cpp-python (bench only)"
        )
    model.train()
    if not train:
        return result

    # training: the round's groups with alternating rewards (every group informative)
    scored = learner.score_local(groups)
    batch = [
        dataclasses.replace(
            g,
            completions=tuple(
                dataclasses.replace(c, reward=float(i % 2)) for i, c in enumerate(g.completions)
            ),
        )
        for g in scored
    ]
    rows = [
        list(g.result.prompt_token_ids) + list(c.token_ids or ())
        for g in groups
        for c in g.result.completions
    ]
    plain_opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    train: dict[str, float] = {}
    for _ in range(repeats):
        for name, run in (
            ("product", lambda: learner.train(batch)),
            ("plain", lambda: plain_step(model, plain_opt, rows, tokenizer.pad_token_id)),
        ):
            seconds, _ = _time(run)
            train[name] = min(train.get(name, float("inf")), seconds)
            print(f"train {name}: {seconds:.1f} s", flush=True)
    result["training_step"] = {
        "seconds": train,
        "sequences": len(rows),
        "tokens": sum(len(r) for r in rows),
        "product_over_plain": train["product"] / train["plain"],
    }
    return result


def _machine(threads: int) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads": threads,
        "load_avg_at_start": os.getloadavg(),
        "note": "shared 2-core machine; compare variants within this file only",
    }


def _profile(args: argparse.Namespace, result: dict[str, Any], out: Path) -> dict[str, Any]:
    """The profile; the record is written after each size (``profile.complete`` false until
    the last), so a run cut short keeps what it measured."""
    repeats = 1 if args.quick else args.repeats
    machine = _machine(args.threads)

    names = tuple(n.strip() for n in args.sizes.split(",") if n.strip())

    def done(part: dict[str, Any]) -> None:
        partial = {"machine": machine, **part, "complete": False}
        _write(out, _merge(args, out, result | {"profile": partial}))

    measured = profile(
        quick=args.quick, repeats=repeats, threads=args.threads, done=done, names=names
    )
    return {"machine": machine, **measured, "complete": True}


def _merge(args: argparse.Namespace, out: Path, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` over the existing record's other part (and other profile sizes) when
    only some are re-run."""
    whole = args.only == "all" and args.sizes == "table,large"
    if whole or not out.exists():
        return result
    # one part re-run: the other part's record stays, under the machine it ran on
    kept = json.loads(out.read_text())
    if args.only == "compare":
        kept = {"profile": kept["profile"]} if "profile" in kept else {}
    elif "profile" in result and "profile" in kept:
        # sizes not re-run keep their records (each names when it ran and the load then)
        sizes = kept["profile"].get("sizes", {}) | result["profile"]["sizes"]
        result = result | {"profile": result["profile"] | {"sizes": sizes}}
    return kept | result


def _write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


def _bf16_copy(model: Any) -> Any:
    import copy

    return copy.deepcopy(model).to(torch.bfloat16).eval()


def _llama_cpp(threads: int) -> Any:
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    import tempfile

    from llama_cpp import Llama  # type: ignore[import-not-found,unused-ignore]

    gguf = gguf_path(MODEL, Path(tempfile.mkdtemp()))  # the packaged file, sha256 checked
    return Llama(model_path=str(gguf), n_ctx=1024, n_threads=threads, verbose=False, seed=0)


if __name__ == "__main__":
    main()
