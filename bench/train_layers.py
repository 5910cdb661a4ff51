"""What ``[model] train_layers`` buys on a CPU: one node-round of SmolLM2-135M-Instruct
(generate, score, one GRPO step) training every weight, or only the last 8, 4, 2 blocks.

Each variant is a lone node (the product's round: ``experiment.paper_table_real``'s
single-node runner) at the real-model table's sizes (B = 4 questions x L = 4 completions x
32 tokens, the ``real_mix`` families, one torch thread) for ``--rounds`` rounds; the same
seed, so the same questions. The variants run one after another, so machine load hits
them alike only on a quiet machine: compare the ratios, not the seconds. Full results go to
``bench/results/train_layers.json``, ``--quick`` (1 round, 8 tokens) to
``bench/results/quick/train_layers.json``.

    python bench/train_layers.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import torch
from results_path import results_path  # bench/ is on sys.path when run as a script

from sapo_async.experiment.paper_table_async_spec import ASYNC_PRESETS
from sapo_async.experiment.paper_table_real import single_node_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 8 tokens")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = ASYNC_PRESETS["smollm2"]
    rounds = 1 if args.quick else args.rounds
    if args.quick:
        spec = dataclasses.replace(spec, max_new_tokens=8)
    rows = []
    for layers in (None, 8, 4, 2):
        t0 = time.perf_counter()
        curve = single_node_curve(dataclasses.replace(spec, train_layers=layers), rounds)
        rows.append(
            {
                "train_layers": layers,
                "trainable_parameters": curve["trainable_parameters"],
                "generate_s": curve["phase_s"]["generate"],
                "train_s": curve["phase_s"]["train"],
                "seconds": time.perf_counter() - t0,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    full = rows[0]["train_s"]
    for row in rows:
        row["train_speedup"] = full / row["train_s"]
    out = results_path("train_layers", quick=args.quick)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "model": spec.model,
                "sizes": {
                    "questions": spec.questions_per_round,
                    "completions": spec.completions_per_question,
                    "max_new_tokens": spec.max_new_tokens,
                    "rounds": rounds,
                    "tasks": spec.tasks,
                    "torch_threads": 1,
                },
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "load_average": os.getloadavg(),
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"-> {out}")


if __name__ == "__main__":
    main()
