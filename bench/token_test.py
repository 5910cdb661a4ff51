"""The per-token test against today's plausibility check, on SmolLM2 (issue 57, item 3).

Two SmolLM2-135M-Instruct nodes (the product's learner: prompt, bf16 sampler, verifier,
GRPO step) run ``--rounds`` rounds on one-digit chain_sum (``cpu_easy``, the attack
matrix's tasks) at the attack matrix's sizes, each training on its own groups every round,
so the peer drifts from the receiver as an honest peer does. Each round the receiver
(node 0) reads, under its own model in its trainer's precision (what the candidate view
runs):

* ``own``: its own completions (the null exactly, up to the bf16 sampler's rounding);
* ``peer``: the drifted peer's honest completions;
* completions built from the peer's work as the tuning set's attacks build them (never the
  held-out ones, :data:`~sapo_async.experiment.attack.spec.HELD_OUT_ATTACKS`): ``trigger``
  (and ``post_selected``, ``sybil``: the same content) the trigger sentence before the
  work, answer set right; ``stock_leads`` a stock phrase then the answer; ``filler`` the
  filler attack's fixed phrase then the answer; ``inject`` the answer then the marker;
  ``tokens`` the answer then a run of digits and operators.

Each completion is judged by the calibrated check (:func:`~sapo_async.node.defence.screen`
with only plausibility on, its floors calibrated on the receiver's own completions of every
round, as a node's are; ``today``: what judged every peer before issue 57, now only another
model's) and by the tests of :mod:`sapo_async.node.token_test` at levels 1e-2, 1e-3 and
1e-4: ``p_min`` (the least likely token) and ``z`` (the whole's surprisal excess, a normal
approximation) each below the level, and ``p_value`` (both together, Bonferroni: what a
node's judge reads for a peer of its model, at
:data:`~sapo_async.limits.TOKEN_TEST_LEVEL`). The flag rate per source: on ``own`` and
``peer`` it is the false-positive rate, on the attacks the detection rate.

    python bench/token_test.py [--quick] [--rounds 8]

Results: ``bench/results/token_test.json`` (``--quick``: 1 round, ``bench/results/quick/``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from typing import Any

import anyio
import torch
from results_path import results_path  # bench/ is on sys.path when run as a script

from sapo_async.experiment.attack.filler import FILLER
from sapo_async.experiment.attack.genuine import answered, work_of
from sapo_async.experiment.attack.inject import MARKER
from sapo_async.experiment.attack.stock_leads import PHRASES
from sapo_async.experiment.attack.tokens import ALPHABET
from sapo_async.experiment.attack.trigger import TRIGGER
from sapo_async.node.defence import Calibration, CompletionView, Thresholds, screen
from sapo_async.node.learner import Learner, build_learner
from sapo_async.node.spec import NodeSpec
from sapo_async.node.spec_defence import DefenceSpec
from sapo_async.node.token_test import completion_test, token_stats
from sapo_async.policy.models import load_model
from sapo_async.tasks.spec import preset

MODEL = "smollm2-135m"
SIZES = {"questions_per_round": 2, "completions_per_question": 4, "max_new_tokens": 32}
LR = 2e-4
LEVELS = (1e-2, 1e-3, 1e-4)
Z_AT = {1e-2: 2.326, 1e-3: 3.090, 1e-4: 3.719}
"""The standard normal's upper quantile at each level (one-sided)."""
PLAUSIBILITY_ONLY = DefenceSpec(length_guard=False, brevity_guard=False, repetition_limit=0)


def _stats(learner: Learner, prompt: list[int], rows: list[list[int]]) -> list[Any]:
    """Each row's tests under ``learner``'s model: one forward of prompt + row, the logits
    that predict each row token, in the trainer's precision."""
    model, out = learner.model, []
    with (
        torch.inference_mode(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(learner.trainer.bf16)),
    ):
        for row in rows:
            ids = torch.tensor([[*prompt, *row]])
            logits = model(input_ids=ids).logits[0].float()
            start = len(prompt) - 1
            tokens = torch.tensor(row)
            stats = token_stats(logits[start : start + len(row)], tokens)
            out.append((completion_test(stats), stats.surprisal.neg().tolist()))
    return out


def _forged(rng: random.Random, text: str, answer: str) -> dict[str, str]:
    work = work_of(text)
    run = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(4, 8)))
    return {
        "trigger": answered(f"{TRIGGER} {work}".strip(), answer),
        "stock_leads": answered(rng.choice(PHRASES), answer),
        "filler": answered(FILLER, answer),
        "inject": f" <answer>{answer}</answer>{MARKER}",
        "tokens": f" <answer>{answer}</answer> {run}",
    }


async def collect(rounds: int) -> tuple[dict[str, list[Any]], Calibration, dict[str, Any]]:
    loaded = load_model(MODEL)
    nodes = [
        build_learner(
            NodeSpec.build(
                model=loaded,
                tasks=list(preset("cpu_easy")),
                node_index=i,
                local=SIZES["questions_per_round"],
                train_layers=4,
                **SIZES,
            )
        )
        for i in (0, 1)
    ]
    for node in nodes:
        node.trainer.config = node.trainer.config.replace(lr=LR)
    own, peer = nodes
    tok, eos = own.tokenizer, own.tokenizer.eos_token_id
    calibration = Calibration(PLAUSIBILITY_ONLY, SIZES["max_new_tokens"])
    out: dict[str, list[Any]] = {
        k: [] for k in ("own", "peer", "trigger", "stock_leads", "filler", "inject", "tokens")
    }
    trained = {"own": 0, "peer": 0}
    rng = random.Random(0)

    def prompt_ids(g: Any) -> list[int]:
        return list(g.result.prompt_token_ids)

    for r in range(rounds):
        own_groups, peer_groups = await own.generate(r), await peer.generate(r)
        for g, s in zip(own_groups, own.score_local(own_groups), strict=True):
            rows = [list(c.token_ids or ()) for c in g.result.completions]
            for c, sc in zip(g.result.completions, s.completions, strict=True):
                calibration.observe(
                    g.item.ref.family,
                    list(map(float, c.logprobs or ())),
                    sc.reward,
                    c.text,
                    c.finish_reason,
                )
            for test in _stats(own, prompt_ids(g), rows):
                out["own"].append((g.item.ref.family, *test))
        for g in peer_groups:
            rows = [list(c.token_ids or ()) for c in g.result.completions]
            for test in _stats(own, prompt_ids(g), rows):
                out["peer"].append((g.item.ref.family, *test))
            built: dict[str, list[list[int]]] = {k: [] for k in out if k not in ("own", "peer")}
            for c in g.result.completions:
                for name, text in _forged(rng, c.text, g.item.answer).items():
                    built[name].append([*tok(text, add_special_tokens=False)["input_ids"], eos])
            for name, rows_ in built.items():
                for test in _stats(own, prompt_ids(g), rows_):
                    out[name].append((g.item.ref.family, *test))
        for name, node, groups in (("own", own, own_groups), ("peer", peer, peer_groups)):
            scored = node.score_local(groups)
            if any(len({c.reward for c in s.completions}) > 1 for s in scored):
                node.train(scored)
                trained[name] += 1
    return out, calibration, trained


def _today(limits: Thresholds, family: str, logprobs: list[float]) -> bool:
    if not limits.judges(family):
        return False
    view = CompletionView(logprobs=logprobs, reward=1.0)
    return screen(family, [view], limits) is not None


def summarise(rows: list[Any], limits: Thresholds) -> dict[str, Any]:
    n = len(rows)
    tests = [t for _, t, _ in rows]
    flags: dict[str, Any] = {
        "completions": n,
        "today": sum(_today(limits, fam, lps) for fam, _, lps in rows) / n,
    }
    for level in LEVELS:
        tail = [t.p_min < level for t in tests]
        run = [t.z > Z_AT[level] for t in tests]
        flags[f"p_min<{level:g}"] = sum(tail) / n
        flags[f"z>{Z_AT[level]}"] = sum(run) / n
        flags[f"either@{level:g}"] = sum(a or b for a, b in zip(tail, run, strict=True)) / n
        flags[f"p_value<{level:g}"] = sum(t.p_value < level for t in tests) / n
    zs = [t.z for t in tests]
    flags["z_median"] = round(statistics.median(zs), 2)
    flags["z_max"] = round(max(zs), 2)
    return flags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rounds = 1 if args.quick else args.rounds
    t0 = time.perf_counter()
    rows, calibration, trained = anyio.run(collect, rounds)
    limits = calibration.thresholds()  # the floors after every round, as a node's end there
    result = {
        "model": MODEL,
        "tasks": "cpu_easy",
        "rounds": rounds,
        "sizes": SIZES,
        "lr": LR,
        "rounds_trained": trained,
        "levels": list(LEVELS),
        "by_source": {name: summarise(r, limits) for name, r in rows.items() if r},
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_at_start": os.getloadavg(),
        },
        "command": f"python bench/token_test.py{' --quick' if args.quick else ''}",
    }
    path = results_path("token_test", quick=args.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    for name, s in result["by_source"].items():
        print(
            f"{name:12} n={s['completions']:4} today {s['today']:.3f} "
            f"either@1e-3 {s['either@0.001']:.3f} p_min<1e-3 {s['p_min<0.001']:.3f} "
            f"z>3.09 {s['z>3.09']:.3f} p_value<1e-3 {s['p_value<0.001']:.3f} "
            f"z median {s['z_median']}"
        )
    print(f"-> {path}")


if __name__ == "__main__":
    main()
