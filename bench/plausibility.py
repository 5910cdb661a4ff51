"""What the plausibility check reads on a real model: SmolLM2's own completions against the
attacks', per statistic (issue 23).

One SmolLM2-135M-Instruct node (the product's learner: its prompt, sampler and verifier)
samples ``--rounds`` rounds of its own B x L completions on one-digit chain_sum
(``cpu_easy``, the attack matrix's tasks); a second node of the same weights samples a
peer's honest completions of the same rounds; for each of the peer's questions the attacks'
rewarded completions are built as the attack matrix forges them: ``inject`` (the right
answer plus the marker), ``tokens`` (plus a random run of digits and operators), ``length``
(the right answer padded to the completion cap), and the wrong answer they pair it with.
Every completion is scored under the first node's model
(:func:`~sapo_async.node.plausibility.token_logprobs_batch`, what the candidate view runs)
and summarised by each statistic the check could use: the
mean token log-prob, the lowest, and the mean of the 2 and 3 lowest
(:func:`~sapo_async.node.defence.low_mean`), at the 0 %, 1 %, 5 %, 50 % and 100 % quantiles.
Own completions are also resampled (concatenated at random) to 32, 128 and 512 tokens to
show how the 3 lowest fall with length (why the floor is bucketed by length).

    python bench/plausibility.py [--quick] [--rounds 8]

Full results go to ``bench/results/plausibility.json``, ``--quick`` (1 round) to
``bench/results/quick/plausibility.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import torch
from results_path import results_path  # bench/ is on sys.path when run as a script

from sapo_async.experiment.attack.base import wrong_answer
from sapo_async.experiment.attack.inject import MARKER
from sapo_async.experiment.attack.length import Length
from sapo_async.experiment.attack.tokens import ALPHABET
from sapo_async.node.defence import low_mean
from sapo_async.node.learner import Learner, build_learner
from sapo_async.node.plausibility import token_logprobs_batch
from sapo_async.node.spec import NodeSpec
from sapo_async.policy.models import load_model
from sapo_async.tasks.spec import preset

MODEL = "smollm2-135m"
SIZES = {"questions_per_round": 4, "completions_per_question": 4, "max_new_tokens": 32}
STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": lambda r: sum(r) / len(r),
    "min": min,
    "low2": lambda r: low_mean(r, 2),
    "low3": lambda r: low_mean(r, 3),
}
QUANTILES = (0.0, 0.01, 0.05, 0.5, 1.0)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        f"q{round(q * 100)}": round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)
        for q in QUANTILES
    }


def summarise(rows: list[list[float]]) -> dict[str, Any]:
    rows = [r for r in rows if r]
    return {
        "completions": len(rows),
        "mean_tokens": round(sum(map(len, rows)) / len(rows), 2),
        **{name: quantiles([f(r) for r in rows]) for name, f in STATISTICS.items()},
    }


def resampled_low3(rows: list[list[float]], n: int, draws: int = 500) -> dict[str, float]:
    """The 3 lowest of n own tokens: own completions concatenated at random to n tokens."""
    rng = random.Random(0)
    lows = []
    for _ in range(draws):
        seq: list[float] = []
        while len(seq) < n:
            seq += rng.choice(rows)
        lows.append(low_mean(seq[:n], 3))
    return quantiles(lows)


def logprobs(learner: Learner, prompt: str, rows: list[list[int]]) -> list[list[float]]:
    tok = learner.tokenizer
    ids = tok(prompt, add_special_tokens=not learner.settings.chat_template)["input_ids"]
    out = token_logprobs_batch(learner.model, ids, rows, pad=tok.eos_token_id)
    return [lp.tolist() for lp in out]


async def collect(rounds: int) -> dict[str, list[list[float]]]:
    loaded = load_model(MODEL)
    nodes = [
        build_learner(
            NodeSpec.build(
                model=loaded, tasks=list(preset("cpu_easy")), node_index=i, local=2, **SIZES
            )
        )
        for i in (0, 1)
    ]
    own, peer = nodes
    tok, eos = own.tokenizer, own.tokenizer.eos_token_id
    out: dict[str, list[list[float]]] = {
        "own_behaviour": [],
        "own": [],
        "peer": [],
        "inject": [],
        "tokens": [],
        "length": [],
        "wrong": [],
    }
    rng = random.Random(0)
    length = Length(SIZES["max_new_tokens"], tok)  # as the attack matrix builds it
    for r in range(rounds):
        for g in await own.generate(r):
            rows = [list(c.token_ids or ()) for c in g.result.completions]
            out["own_behaviour"] += [
                list(map(float, c.logprobs or ())) for c in g.result.completions
            ]
            out["own"] += logprobs(own, g.prompt, rows)
        for g in await peer.generate(r):
            rows = [list(c.token_ids or ()) for c in g.result.completions]
            out["peer"] += logprobs(own, g.prompt, rows)
            answer = g.item.answer
            run = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(4, 8)))
            texts = {
                "inject": f" <answer>{answer}</answer>{MARKER}",
                "tokens": f" <answer>{answer}</answer> {run}",
                "length": length.padded(answer),
                "wrong": f" <answer>{wrong_answer(answer)}</answer>",
            }
            forged = [[*tok(t, add_special_tokens=False)["input_ids"], eos] for t in texts.values()]
            for name, lp in zip(texts, logprobs(own, g.prompt, forged), strict=True):
                out[name].append(lp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rounds = 1 if args.quick else args.rounds
    t0 = time.perf_counter()
    rows = anyio.run(collect, rounds)
    own = rows["own_behaviour"]
    result = {
        "model": MODEL,
        "tasks": "cpu_easy",
        "rounds": rounds,
        "sizes": SIZES,
        "marker": MARKER,
        "by_source": {name: summarise(r) for name, r in rows.items()},
        "own_low3_resampled": {str(n): resampled_low3(own, n) for n in (32, 128, 512)},
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": f"python bench/plausibility.py{' --quick' if args.quick else ''}",
    }
    path = results_path("plausibility", quick=args.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    for name, s in result["by_source"].items():
        print(f"{name:14} n={s['completions']:4}  mean {s['mean']}  low3 {s['low3']}")
    print("own low3 resampled:", result["own_low3_resampled"])
    print(f"-> {path}")


if __name__ == "__main__":
    main()
