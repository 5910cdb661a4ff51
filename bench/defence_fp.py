"""Honest false positives of the content defences across real models (issue 22, item 5).

A swarm of SmolLM2-135M, Gemma 3 270M and tiny-model nodes shares *text*: every receiver
re-tokenises a peer's completions with its own tokenizer, re-scores them with its own
verifier and screens them with its own defences, calibrated on its own completions. This
bench measures, for every ordered pair (producer P, receiver R) of those three models, how
many *honest* groups R's defences drop, and for which reason.

Both sides run the product's own path, nothing re-implemented:

* producer P: :func:`~sapo_async.node.learner.build_learner`, ``learner.generate`` and
  :func:`~sapo_async.node.groups.to_rollout_group` (what
  :meth:`~sapo_async.node.rounds.RoundLoop.share_round` publishes, token ids included as
  ``fabric.include_tokens`` says), signed with a real key (:func:`sign_group`) and
  verified back (:func:`verify`), so the receiver gets the decoded wire group;
* receiver R: the collector's content admission checks of ``NodeDefences.build`` (preset
  and sizes: quarantine and the producer-round cap concern floods, not honest content),
  then its calibration from its *own* honest rounds (``calibrate`` per round, exactly as
  :meth:`~sapo_async.node.rounds.RoundLoop._choose`), then one
  :func:`~sapo_async.node.selection.select_groups` over P's groups with J = all of them
  (so every candidate is scored and screened) and the defences on.

Receiver and producer of one model are two nodes (node index 0 calibrates, node index 1
produces the tested groups), so a receiver is never calibrated on the groups it screens.
The false-positive rate of a pair is drops / groups; ``informative`` groups (rewards not
all equal) are the only ones the token check, plausibility and the length guard look at
(only completions above the group's lowest reward are screened), so the rate over
informative groups is reported too, with a one-sided 95 % Clopper-Pearson upper bound
(0 of 16 groups bounds the rate at 17 %, not at 1 %). Because small models at temperature 1
rarely answer right, few completions are pushed and the round's verdicts alone say little;
``as_if_pushed`` applies every check to every completion, as if all were pushed up (an
upper bound on what the round would drop). Each dropped group is recorded with what its
checks read (token counts in both tokenizers, mean log-probs, texts).

    just bench defence_fp [--quick]

Full results go to ``bench/results/defence_fp.json``, ``--quick`` to
``bench/results/quick/defence_fp.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import torch
from eth_account import Account

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench.*

from bench.results_path import results_path
from sapo_async.errors import RejectedInput
from sapo_async.fabric.admission import Arrival
from sapo_async.fabric.buffered import BufferedGroup
from sapo_async.node.admission import NodeDefences, PresetCheck, SizeBounds
from sapo_async.node.defence import Thresholds
from sapo_async.node.groups import SharedRound, to_rollout_group
from sapo_async.node.learner import Learner, build_learner
from sapo_async.node.selection import calibrate, select_groups, size_bound
from sapo_async.node.spec import NodeSpec
from sapo_async.node.view import CandidateView
from sapo_async.policy.grpo.trainer import ScoredGroup
from sapo_async.policy.models import LoadedModel, load_model, load_tiny_model, tiny_spec
from sapo_async.wire.signing import sign_group, verify

MODELS = ("tiny", "smollm2-135m", "gemma3-270m")
SWARM = "defence-fp"
TINY_REGIME = "dense"  # the regime mixed swarms use (tests/integration/test_mixed_swarm.py)


@dataclass(frozen=True, slots=True)
class Sizes:
    """Every size of a run (all stated in the results).

    Attributes:
        groups: honest groups each producer shares (tested by every receiver).
        calibration_groups: own groups each receiver calibrates on before screening.
        questions_per_round: B (groups per round, on both sides).
        completions: L, completions per group.
        max_new_tokens: every node's completion cap.
        families: the task families.
        seed: the swarm seed.
        models: the models (producers and receivers alike).
        calibration_min: ``defence.calibration_min`` (None: the default, 32 completions).
    """

    groups: int
    calibration_groups: int
    questions_per_round: int
    completions: int
    max_new_tokens: int
    families: tuple[str, ...]
    seed: int
    models: tuple[str, ...]
    calibration_min: int | None = None


# Sized for two shared CPU cores (about 2 minutes per SmolLM2 round of 8 x 4 completions
# under load; Gemma 3's 262k-token vocabulary costs more): one family, so that one own round
# (8 x 4 = 32 completions) reaches the default calibration_min of 32.
FULL = Sizes(16, 8, 8, 4, 24, ("basic_arithmetic",), 7, MODELS)
QUICK = Sizes(4, 8, 4, 4, 16, ("basic_arithmetic",), 7, MODELS)


def load(name: str) -> LoadedModel:
    """One model, loaded once (shared by its producer and receiver nodes)."""
    if name == "tiny":
        return load_tiny_model(tiny_spec(TINY_REGIME))
    return load_model(name)


def node_spec(loaded: LoadedModel, sizes: Sizes) -> NodeSpec:
    """The spec both nodes of one model use (defences at their defaults, on)."""
    defence = {} if sizes.calibration_min is None else {"calibration_min": sizes.calibration_min}
    return NodeSpec.build(
        **defence,
        model=loaded,
        regime=TINY_REGIME,
        tasks=list(sizes.families),
        swarm=SWARM,
        seed=sizes.seed,
        questions_per_round=sizes.questions_per_round,
        completions_per_question=sizes.completions,
        max_new_tokens=sizes.max_new_tokens,
        local=min(4, sizes.questions_per_round),
    )


def rounds_for(groups: int, per_round: int) -> int:
    return max(1, math.ceil(groups / per_round))


async def produce(learner: Learner, spec: NodeSpec, sizes: Sizes) -> list[BufferedGroup]:
    """Producer P's honest groups as a receiver gets them: generated, put on the wire,
    signed, verified and decoded."""
    account = Account.from_key(bytes([1 + learner.settings.node_index]) * 32)
    out: list[BufferedGroup] = []
    for r in range(rounds_for(sizes.groups, sizes.questions_per_round)):
        for g in await learner.generate(r):
            wire = to_rollout_group(
                g,
                swarm=SWARM,
                producer=account.address,
                producer_round=r,
                policy_version=learner.policy_version,
                model_id=learner.model_id,
                tokenizer_id=learner.tokenizer_id,
                include_tokens=spec.fabric.include_tokens,
            )
            verified = verify(sign_group(account, wire))
            out.append(BufferedGroup(verified.group, verified.rollout_hash, time.time()))
    return out[: sizes.groups]


async def calibrated(
    learner: Learner, spec: NodeSpec, sizes: Sizes
) -> tuple[Thresholds, list[ScoredGroup], dict[str, Any]]:
    """Receiver R's thresholds after its own honest calibration rounds (as ``_choose``),
    with its last round's own scored groups (the round's local groups)."""
    calibration = NodeDefences.build(spec, learner.tasks.families).calibration
    rewards: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    local: list[ScoredGroup] = []
    for r in range(rounds_for(sizes.calibration_groups, sizes.questions_per_round)):
        generated = await learner.generate(r)
        local = learner.score_local(generated)
        calibrate(calibration, SharedRound(r, generated, local, [], 0, 0.0, 0.0, 0.0))
        for g, s in zip(generated, local, strict=True):
            counts[g.item.ref.family] += len(s.completions)
            rewards[g.item.ref.family] += sum(c.reward > 0 for c in s.completions)
    limits = calibration.thresholds()
    info = {
        "max_tokens": limits.max_tokens,
        "families": {
            f: {
                "own_completions": counts[f],
                "own_rewarded": rewards[f],
                "min_mean_logprob": t.min_mean_logprob,
                "max_rewarded_tokens": t.max_rewarded_tokens,
            }
            for f, t in sorted(limits.families.items())
        },
    }
    return limits, local, info


def admitted(spec: NodeSpec, learner: Learner, group: BufferedGroup) -> str | None:
    """The content admission checks' reason to refuse ``group`` (None: admitted)."""
    checks = [
        c
        for c in NodeDefences.build(spec, learner.tasks.families).checks
        if isinstance(c, PresetCheck | SizeBounds)
    ]
    arrival = Arrival(group.group, group.rollout_hash, None, None, time.time(), None)
    for check in checks:
        try:
            check(arrival)
        except RejectedInput as exc:
            return str(exc.reason)
    return None


def upper_95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate seen k times in n."""
    if n == 0 or k >= n:
        return 1.0

    def tail(p: float) -> float:  # P(X <= k | n, p)
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))

    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) > 0.05 else (lo, mid)
    return hi


def read(learner: Learner, group: BufferedGroup, limits: Thresholds) -> dict[str, Any]:
    """What each check would read of *every* completion of one group, on the receiver's view.

    The round screens only completions above a group's lowest reward (and only informative
    groups), so with few rewarded completions the round's own verdicts say little about the
    checks; this reads all completions the way the checks would: the receiver's token count
    (size bound), whether a same-tokenizer peer's ids are its text's own tokens (token
    check), the mean log-prob under the receiver's model (plausibility; not run for a
    completion over the size bound, which the round drops before any forward pass).
    """
    scored = learner.score_external(group.group)
    view = CandidateView(
        scored,
        model=learner.model,
        tokenizer=learner.tokenizer,
        tokenizer_id=learner.tokenizer_id,
        add_special_tokens=not learner.settings.chat_template,
    )
    floor = min(scored.rewards)
    bound = size_bound(limits, same_tokenizer=view.same_tokenizer)
    fits = [i for i, ids in enumerate(view.token_ids) if len(ids) <= bound]
    lps = dict(zip(fits, view.logprobs(fits), strict=True)) if fits else {}
    rows = []
    for i, c in enumerate(scored.completions):
        lp = lps.get(i)
        rows.append(
            {
                "reward": c.reward,
                "pushed": c.reward > floor,
                "finish_reason": c.finish_reason,
                "producer_tokens": None if c.token_ids is None else len(c.token_ids),
                "receiver_tokens": len(view.token_ids[i]),
                "size_bound": bound,
                "peer_ids_match": (
                    view.peer_ids_match(i)
                    if view.same_tokenizer and c.token_ids is not None
                    else None
                ),
                "mean_logprob": float(lp.mean()) if lp is not None and len(lp) else None,
                "text": c.text,
            }
        )
    return {
        "family": group.group.task.family,
        "informative": len(set(scored.rewards)) > 1,
        "completions": rows,
    }


def failed_check(family: str, c: dict[str, Any], limits: Thresholds) -> str | None:
    """The first check (in the round's order) one completion fails as if it were pushed."""
    fam = limits.families.get(family)
    if c["receiver_tokens"] > c["size_bound"]:
        return "completion_too_many_tokens"
    if c["peer_ids_match"] is False:
        return "token_mismatch"
    cap = None if fam is None else fam.max_rewarded_tokens
    if limits.length_guard and cap is not None and c["reward"] > 0 and c["receiver_tokens"] > cap:
        return "too_long"
    floor = None if fam is None else fam.min_mean_logprob
    lp = c["mean_logprob"]
    if limits.plausibility and floor is not None and lp is not None and lp < floor:
        return "implausible"
    return None


def as_if_pushed(reads: list[dict[str, Any]], limits: Thresholds) -> dict[str, Any]:
    """Every check applied to *every* completion, as if all were pushed up.

    The round screens only completions above their group's lowest reward; with small models
    that rarely answer right, few are, and the round's verdicts then say little about the
    checks. This reads each completion the way the checks would, and counts per completion
    and per group (a group counted once, under the first check that fails it, in the
    round's order: the size bound on every completion, then the token check, then
    :func:`~sapo_async.node.defence.screen`'s length guard and plausibility).
    """
    completions: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    examples: dict[str, list[dict[str, Any]]] = {}
    for r in reads:
        reasons = [failed_check(r["family"], c, limits) for c in r["completions"]]
        for c, reason in zip(r["completions"], reasons, strict=True):
            if reason is not None:
                completions[reason] += 1
                if len(examples.setdefault(reason, [])) < 3:
                    examples[reason].append(c)
        order = ("completion_too_many_tokens", "token_mismatch", "too_long", "implausible")
        first = next((x for x in order if x in reasons), None)
        if first is not None:
            groups[first] += 1
    rows = [c for r in reads for c in r["completions"]]
    lps = sorted(c["mean_logprob"] for c in rows if c["mean_logprob"] is not None)
    return {
        "completions": len(rows),
        "pushed": sum(c["pushed"] for c in rows),
        "rewarded": sum(c["reward"] > 0 for c in rows),
        "same_tokenizer_with_ids": sum(c["peer_ids_match"] is not None for c in rows),
        "plausibility_measured": len(lps),
        "failed_completions": dict(completions),
        "failed_groups": dict(groups),
        "groups_over_max_tokens": groups["completion_too_many_tokens"],
        "mean_logprob_min": lps[0] if lps else None,
        "mean_logprob_median": lps[len(lps) // 2] if lps else None,
        "receiver_over_producer_tokens": (
            sum(c["receiver_tokens"] for c in rows)
            / max(1, sum(c["producer_tokens"] or 0 for c in rows))
        ),
        "examples": examples,
    }


def judge(
    learner: Learner,
    spec: NodeSpec,
    limits: Thresholds,
    groups: list[BufferedGroup],
    round_: int,
    local: list[Any],
) -> dict[str, Any]:
    """Receiver R's verdicts on one producer's groups: admission, then the round's
    post-admission checks (one ``select_groups``), then what each check read."""
    refused: Counter[str] = Counter()
    fresh: list[BufferedGroup] = []
    for g in groups:
        reason = admitted(spec, learner, g)
        if reason is None:
            fresh.append(g)
        else:
            refused[reason] += 1
    fresh.sort(key=lambda b: b.rollout_hash)
    training = spec.training.replace(external=max(1, len(fresh)))
    t0 = time.perf_counter()
    choice = select_groups(
        learner, training, round_, local=local, fresh=tuple(fresh), newest={}, limits=limits
    )
    seconds = time.perf_counter() - t0
    dropped = Counter(v.reason for v in choice.drops)
    reads = {b.rollout_hash: read(learner, b, limits) for b in fresh}
    informative = sum(r["informative"] for r in reads.values())
    n, k = len(groups), sum(dropped.values()) + sum(refused.values())
    return {
        "groups": n,
        "informative": informative,
        "admission_refused": dict(refused),
        "dropped": dict(dropped),
        "passed": len(choice.passed),
        "fp_rate": k / n if n else 0.0,
        "fp_rate_upper_95": upper_95(k, n),
        "fp_rate_informative": (k / informative) if informative else None,
        "as_if_pushed": as_if_pushed(list(reads.values()), limits),
        "select_s": round(seconds, 2),
        "drops": [{"reason": v.reason, **reads[v.rollout_hash]} for v in choice.drops],
    }


async def run(sizes: Sizes) -> dict[str, Any]:
    torch.manual_seed(sizes.seed)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    loaded: dict[str, LoadedModel] = {}
    receivers: dict[str, tuple[Learner, NodeSpec]] = {}
    producers: dict[str, tuple[Learner, NodeSpec]] = {}
    shared: dict[str, list[BufferedGroup]] = {}
    models: dict[str, Any] = {}
    for name in sizes.models:
        t0 = time.perf_counter()
        loaded[name] = load(name)
        spec = node_spec(loaded[name], sizes)
        receivers[name] = (build_learner(spec, node_index=0), spec)
        producers[name] = (build_learner(spec, node_index=1), spec)
        learner = receivers[name][0]
        t1 = time.perf_counter()
        shared[name] = await produce(producers[name][0], spec, sizes)
        t2 = time.perf_counter()
        models[name] = {
            "model_id": learner.model_id,
            "tokenizer_id": learner.tokenizer_id,
            "vocab": len(learner.tokenizer),
            "prompt_style": learner.settings.prompt_style,
            "chat_template": learner.settings.chat_template,
            "load_s": round(t1 - t0, 1),
            "produce_s": round(t2 - t1, 1),
        }
        print(f"{name}: loaded in {t1 - t0:.0f} s, {len(shared[name])} groups in {t2 - t1:.0f} s")
    pairs: list[dict[str, Any]] = []
    thresholds: dict[str, Any] = {}
    for rname in sizes.models:
        learner, spec = receivers[rname]
        t0 = time.perf_counter()
        limits, local, info = await calibrated(learner, spec, sizes)
        info["calibrate_s"] = round(time.perf_counter() - t0, 1)
        thresholds[rname] = info
        round_ = rounds_for(sizes.calibration_groups, sizes.questions_per_round)
        for pname in sizes.models:
            verdict = judge(learner, spec, limits, shared[pname], round_, local)
            pairs.append({"producer": pname, "receiver": rname, **verdict})
            print(
                f"{pname:>13} -> {rname:<13} groups {verdict['groups']:3d} "
                f"informative {verdict['informative']:3d} dropped {verdict['dropped']} "
                f"refused {verdict['admission_refused']} fp {verdict['fp_rate']:.3f} "
                f"as if pushed {verdict['as_if_pushed']['failed_groups']}"
            )
    return {"sizes": asdict(sizes), "models": models, "thresholds": thresholds, "pairs": pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes (results/quick/)")
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, help="a subset of the models (default: all)"
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.models:
        sizes = Sizes(**{**asdict(sizes), "models": tuple(args.models)})
    t0 = time.perf_counter()
    result = anyio.run(run, sizes)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    result["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    out = results_path("defence_fp", quick=args.quick or bool(args.models))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out} in {result['total_s']:.0f} s")


if __name__ == "__main__":
    main()
