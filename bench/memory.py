"""Peak memory and time of one GRPO training step at a real vocabulary, before and after.

The model has Qwen2.5-0.5B's vocabulary (151,936) and width (896, MLP 4864, 14 heads, 2
KV heads, tied embeddings) but only ``--layers`` decoder layers (2 by default: the
vocabulary head, the part this bench is about, is whole; the 22 missing layers would add
about 0.35 GB of weights and 4x that of gradients and AdamW state, plus activations of one
micro-batch per layer). The step trains on 8 questions x 8 completions of 512 tokens (every
completion runs to the cap) after 128-token prompts, with behaviour log-probs and
truncated IS on, as a node does.

* **after**: the trainer as it is: completion-token log-probs through the head in chunks,
  micro-batches of ``--micro-batch-tokens`` padded tokens. Its settings come from a
  ``NodeSpec`` with ``max_new_tokens = 512``, the node's one completion length.
* **before**: the same trainer with main's log-prob function put back (kept below as
  :func:`full_vocab_logprobs`): a full-vocabulary ``log_softmax`` at every position of the
  whole batch at once, no micro-batches. At 64 sequences that is 64 x 640 x 151,936 float32
  logits, 25 GB per copy and several copies, which does not fit this 24 GiB machine (shared
  with other jobs). So "before" is measured at ``--before-sequences`` (2 and 3: one
  question, which needs two completions to be informative), with "after" beside it at the
  same sizes, and its peak at 64 sequences is extrapolated linearly from those points
  (memory in that path grows linearly with the sequence count; the two measured points
  give the slope). The JSON says which numbers are measured and
  which extrapolated.

Each measurement runs in a fresh child process (peak RSS from ``getrusage``); the parent
kills a child whose RSS passes ``--rss-limit-gb`` and records that instead.

    just bench memory [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_path import results_path  # noqa: E402

VOCAB, HIDDEN = 151936, 896


def full_vocab_logprobs(model: Any, batch: Any, *, entropy: bool = False) -> tuple[Any, float]:
    """main's ``token_logprobs`` (commit 90985e1), returning the entropy *sum* as the
    trainer now expects: logits and a log_softmax over the vocabulary at every position of
    the batch."""
    import torch

    logits = model(input_ids=batch.ids, attention_mask=batch.attn).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    ent = 0.0
    if entropy:
        with torch.no_grad():
            h = -(logp_all.exp() * logp_all).sum(-1)
            ent = float((h * batch.comp_mask).sum())
    return logp * batch.comp_mask, ent


def _groups(tok: Any, questions: int, completions: int, prompt: int, length: int) -> list[Any]:
    import torch

    from sapo_async.policy.grpo import ScoredCompletion, ScoredGroup
    from sapo_async.policy.grpo.batch import TokenSource
    from sapo_async.policy.models import tokenizer_id

    gen = torch.Generator().manual_seed(0)
    tid = tokenizer_id(tok)
    out = []
    for q in range(questions):
        comps = []
        for c in range(completions):
            ids = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
            lps = (-11.0 - 0.01 * torch.rand(length, generator=gen)).tolist()
            comps.append(
                ScoredCompletion(f"q{q}c{c}", float(c % 2), "length", tuple(ids), tuple(lps))
            )
        out.append(
            ScoredGroup(
                prompt=f"question {q}",
                prompt_token_ids=tuple(torch.randint(0, VOCAB, (prompt,), generator=gen).tolist()),
                tokenizer_id=tid,
                completions=tuple(comps),
                token_source=TokenSource.SAMPLED,
            )
        )
    return out


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One training step in this process; returns what it measured."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sapo_async.policy.grpo import Trainer, TrainerConfig
    from sapo_async.policy.models import train_char_tokenizer

    torch.set_num_threads(args.threads)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4864,
        num_hidden_layers=args.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    tok = train_char_tokenizer(["0123456789 abcdefghijklmnopqrstuvwxyz"])
    before = args.variant == "before"
    trainer_config = TrainerConfig(
        lr=1e-6,
        tis_cap=2.0,
        max_completion_tokens=args.max_new_tokens,  # one completion length
        micro_batch_tokens=None if before else args.micro_batch_tokens,
        gradient_checkpointing=args.gradient_checkpointing and not before,
        bf16=args.bf16 and not before,
    )
    trainer = Trainer(model, tok, trainer_config, add_special_tokens=False)
    if before:
        trainer._logprobs = lambda m, b, *, entropy=False: full_vocab_logprobs(  # type: ignore[method-assign]
            m, b, entropy=entropy
        )
    groups = _groups(tok, args.questions, args.completions, args.prompt_tokens, args.length)
    rss_before_step = _peak_rss_gb()
    t = time.perf_counter()
    if args.progress:
        # one line per micro-batch forward, so a run cut short still says how far it got
        inner = trainer._logprobs
        calls = [0]

        def logged(m: Any, b: Any, *, entropy: bool = False) -> tuple[Any, float]:
            out = inner(m, b, entropy=entropy)
            calls[0] += 1
            with open(args.progress, "a") as f:
                line = {"micro_batch": calls[0], "rows": int(b.ids.shape[0])}
                line |= {"peak_rss_gb": _peak_rss_gb(), "elapsed_s": time.perf_counter() - t}
                f.write(json.dumps(line) + "\n")
            return out

        trainer._logprobs = logged  # type: ignore[method-assign]
    m = trainer.step(groups)
    seconds = time.perf_counter() - t
    return {
        "variant": args.variant,
        "sequences": m.sequences,
        "completion_tokens_trained": m.tokens // max(m.sequences, 1),
        "tokens": m.tokens,
        "max_new_tokens": args.max_new_tokens,
        "peak_rss_gb": _peak_rss_gb(),
        "peak_rss_gb_before_step": rss_before_step,
        "step_s": seconds,
        "loss": m.loss,
        "grad_norm": m.grad_norm,
        "micro_batch_tokens": trainer_config.micro_batch_tokens,
        "bf16": trainer_config.bf16,
        "logprob_chunk_tokens": trainer_config.logprob_chunk_tokens,
    }


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _rss_gb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def measure(
    args: argparse.Namespace, variant: str, questions: int, completions: int
) -> dict[str, Any]:
    """Run one step in a child (or reuse its saved result); kill it past the RSS limit."""
    saved = args.progress_dir / f"{variant}-{questions * completions}.json"
    if args.reuse and saved.exists():
        reused: dict[str, Any] = json.loads(saved.read_text())
        return reused
    progress = saved.with_suffix(".jsonl")
    if args.reuse and args.partial and progress.exists():
        # a run cut short: its peak so far, said as such
        lines = [json.loads(x) for x in progress.read_text().splitlines()]
        return {
            "variant": variant,
            "sequences": questions * completions,
            "complete": False,
            "micro_batches_done": lines[-1]["micro_batch"],
            "peak_rss_gb": lines[-1]["peak_rss_gb"],
            "elapsed_s": lines[-1]["elapsed_s"],
            "completion_tokens_trained": None,
        }
    if args.reuse:
        raise SystemExit(f"--reuse: no saved result {saved}")
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--variant",
        variant,
        "--questions",
        str(questions),
        *("--completions", str(completions), "--length", str(args.length)),
        *("--prompt-tokens", str(args.prompt_tokens), "--layers", str(args.layers)),
        *("--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)),
        *("--micro-batch-tokens", str(args.micro_batch_tokens)),
        *(["--gradient-checkpointing"] if args.gradient_checkpointing else []),
        *(["--bf16"] if args.bf16 and variant == "after" and questions > 1 else []),
        *("--progress", str(args.progress_dir / f"{variant}-{questions * completions}.jsonl")),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    seen = 0.0
    while proc.poll() is None:
        seen = max(seen, _rss_gb(proc.pid))
        if seen > args.rss_limit_gb:
            proc.kill()
            proc.wait()
            return {
                "variant": variant,
                "sequences": questions * completions,
                "killed_above_gb": seen,
            }
        time.sleep(0.2)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"{variant} at {questions} questions failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    (args.progress_dir / f"{variant}-{questions * completions}.json").write_text(json.dumps(result))
    print(
        f"{variant:6s} {result['sequences']:3d} seqs: peak {result['peak_rss_gb']:.2f} GB, "
        f"step {result['step_s']:.0f} s",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short completions, small batch")
    parser.add_argument("--out", type=Path, default=None, help="default: results_path()")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--length", type=int, default=512, help="completion tokens")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: --length")
    parser.add_argument("--micro-batch-tokens", type=int, default=2560)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="the full-size after run under bf16 autocast (side-by-side runs stay float32)",
    )
    parser.add_argument(
        "--before-sequences",
        default="2,3",
        help="sizes (one question, this many completions) where before and after both run",
    )
    parser.add_argument("--rss-limit-gb", type=float, default=14.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", choices=("before", "after"), default="after")
    parser.add_argument("--progress", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--only",
        choices=("full", "small"),
        default=None,
        help="run one part and save it in --progress-dir (two parts can run side by side)",
    )
    parser.add_argument(
        "--reuse", action="store_true", help="write the report from runs saved by --only"
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="with --reuse, report a run still going (or cut short) from its progress lines",
    )
    parser.add_argument(
        "--progress-dir",
        type=Path,
        default=Path("/tmp/sapo-bench-memory"),
        help="each run appends one line per micro-batch here",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.length, args.prompt_tokens, args.questions, args.before_sequences = 32, 16, 2, "2"
    args.max_new_tokens = args.max_new_tokens or args.length
    if args.child:
        print(json.dumps(child(args)))
        return
    started = time.perf_counter()
    load = os.getloadavg()
    args.progress_dir.mkdir(parents=True, exist_ok=True)
    small = [int(x) for x in args.before_sequences.split(",")]
    if args.only == "small":
        for n in small:
            measure(args, "before", 1, n)
            measure(args, "after", 1, n)
        return
    full = measure(args, "after", args.questions, args.completions)
    if args.only == "full":
        return
    side_by_side = [
        {"before": measure(args, "before", 1, n), "after": measure(args, "after", 1, n)}
        for n in small
    ]
    sequences = args.questions * args.completions
    measured = [(p["before"]["sequences"], p["before"].get("peak_rss_gb")) for p in side_by_side]
    points = [(n, gb) for n, gb in measured if gb is not None]
    if len(points) >= 2:
        (n0, g0), (n1, g1) = points[0], points[-1]
        slope = (g1 - g0) / (n1 - n0)
        before_full = g1 + slope * (sequences - n1)
        how = f"linear through the measured before points at {n0} and {n1} sequences"
    else:
        slope, before_full, how = float("nan"), float("nan"), "needs two measured points"
    # one float32 copy of one sequence's logits, [prompt + completion, V]
    copy_gb = (args.prompt_tokens + args.length) * VOCAB * 4 / 2**30
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "load_avg_at_start": load,
            "note": "24 GiB machine shared with other jobs; times are under that load",
        },
        "model": {
            "vocab": VOCAB,
            "hidden": HIDDEN,
            "layers": args.layers,
            "shape": "Qwen2.5-0.5B vocabulary and width, fewer layers",
        },
        "step": {
            "questions": args.questions,
            "completions_per_question": args.completions,
            "prompt_tokens": args.prompt_tokens,
            "completion_tokens": args.length,
            "tis_cap": 2.0,
        },
        "max_new_tokens": args.max_new_tokens,
        "completion_tokens_trained": full.get("completion_tokens_trained"),
        "peak_rss_gb": full.get("peak_rss_gb"),
        "step_s": full.get("step_s"),
        "peak_rss_gb_before": before_full,
        "peak_rss_gb_before_how": f"extrapolated, {how} ({slope:.2f} GB per sequence); "
        f"the full-size before run needs about that much and was not run on this machine",
        "before_logit_copies_at_peak": slope / copy_gb,
        "reduction": before_full / full["peak_rss_gb"] if "peak_rss_gb" in full else None,
        "runs": "each measurement in a fresh child process; with --reuse the report is "
        "written from runs made earlier with --only (full and small side by side)"
        if args.reuse
        else "each measurement in a fresh child process",
        "after": full,
        "side_by_side": side_by_side,
        "wall_s": time.perf_counter() - started,
    }
    out = args.out or results_path("memory", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(
        f"after: {result['peak_rss_gb']:.2f} GB peak at {sequences} x {args.length} tokens "
        f"({result['completion_tokens_trained']} trained per completion); before: "
        f"{before_full:.1f} GB ({how}); wrote {out}"
    )


if __name__ == "__main__":
    main()
