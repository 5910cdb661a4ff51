"""A real model's reward per reasoning-gym family before any training: where sharing can pay.

Sharing pays where learning is sample-limited (docs/learning.md): a family the base model
never solves gives no signal to share, one it mostly solves gives little to learn. This
measures, per family, the mean reward of ``questions`` questions x ``completions``
completions sampled by the node's own generator (the product's prompt, chat template and
sampler, bf16 where the node would use it) and scored by the node's own verifier, and the
share of groups that are informative (rewards not all equal, what GRPO learns from).

Each family runs as one round of a lone node (the lockstep harness, one node, no ledger), so
the questions are the ones a node of slot 0 draws in round 0 of ``seed``.
"""

from __future__ import annotations

import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FamilyBaseline", "family_baselines"]


@dataclass(frozen=True, slots=True)
class FamilyBaseline:
    """One family's start.

    Attributes:
        family: reasoning-gym dataset name.
        config: its dataset config (reasoning-gym's defaults where empty).
        reward: mean reward over every completion.
        informative: share of groups whose rewards are not all equal.
        tagged: share of completions that close an answer tag.
        completion_tokens: mean completion length (tokens).
        seconds: wall time of the family's round (generate and score).
    """

    family: str
    config: dict[str, Any]
    reward: float
    informative: float
    tagged: float
    completion_tokens: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


async def family_baselines(
    model: str,
    families: list[Any],
    *,
    questions: int,
    completions: int,
    max_new_tokens: int,
    seed: int = 0,
    on_family: Any = None,
) -> list[FamilyBaseline]:
    """Measure ``model``'s start on each of ``families`` (names or
    :class:`~sapo_async.tasks.spec.FamilySpec`; see the module docstring).

    Raises:
        ConfigError: an unknown model or family.
    """
    from eth_account import Account

    from sapo_async.fabric.transport.memory import MemoryBroker
    from sapo_async.node.alone import ALONE_SWARM
    from sapo_async.node.spec import NodeSpec
    from sapo_async.node.swarm import assemble, complete_spec
    from sapo_async.policy.models import load_model
    from sapo_async.tasks.spec import FamilySpec

    loaded = load_model(model)  # once; every family's node shares it (nothing trains)
    out: list[FamilyBaseline] = []
    for entry in families:
        family = entry if isinstance(entry, FamilySpec) else FamilySpec(entry)
        broker = MemoryBroker()
        spec = NodeSpec.build(
            swarm=ALONE_SWARM,
            name="baseline",
            account=Account.create(),
            model=loaded,
            tasks=[family],
            seed=seed,
            questions_per_round=questions,
            completions_per_question=completions,
            max_new_tokens=max_new_tokens,
            local=questions,
            external=0,
            transport=broker.connect(ALONE_SWARM),
            ledger_enabled=False,
            defence_active=False,
        )
        async with AsyncExitStack() as stack:
            parts = await assemble(complete_spec(spec), stack, offload=False)
            loop = parts.round_loop(offload=False)
            t0 = time.perf_counter()
            async with parts.collector:
                shared = await loop.share_round()
            seconds = time.perf_counter() - t0
        rewards = [c.reward for g in shared.local for c in g.completions]
        texts = [c.text for g in shared.generated for c in g.result.completions]
        lengths = [len(c.token_ids or ()) for g in shared.generated for c in g.result.completions]
        result = FamilyBaseline(
            family=family.family,
            config=dict(family.config),
            reward=statistics.fmean(rewards) if rewards else 0.0,
            informative=sum(len({c.reward for c in g.completions}) > 1 for g in shared.local)
            / max(len(shared.local), 1),
            tagged=sum("</answer>" in t for t in texts) / max(len(texts), 1),
            completion_tokens=statistics.fmean(lengths) if lengths else 0.0,
            seconds=seconds,
        )
        out.append(result)
        if on_family is not None:
            on_family(result)
    return out
