"""A candidate's view is built only for what reads it: with the defences off, the round
tokenises only the candidates the sampler chose and runs none through the model; with them
on, every scored candidate is tokenised once (the size bound) and never again."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from sapo_async.fabric.collector import BufferedGroup
from sapo_async.node.defence import Thresholds
from sapo_async.node.selection import select_groups
from sapo_async.node.spec import TrainingSpec
from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup, TokenSource
from tests.fixtures.selection import SAMPLING


class _CountingTokenizer:
    eos_token_id = 10
    pad_token_id = 0

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        self.calls[text] += 1
        return {"input_ids": [1 + (ord(ch) % 9) for ch in text]}


class _NoModel:
    """A model that must never be run (no defence asks for log-probs here)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a candidate was run through the model")

    def parameters(self) -> Any:
        raise AssertionError("a candidate was run through the model")


def _candidates() -> tuple[tuple[BufferedGroup, ...], dict[str, ScoredGroup]]:
    """Five peers' groups: two uninformative, three informative (one of each text per
    group, so a tokeniser call names its group)."""
    fresh, scored = [], {}
    for n, rewards in enumerate([(1.0, 1.0), (0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 0.5)]):
        producer = f"0xpeer{n}"
        group = SimpleNamespace(producer=producer)
        fresh.append(BufferedGroup(group, bytes([n]) * 32, 0.0))  # type: ignore[arg-type]
        scored[producer] = ScoredGroup(
            prompt=f"q{n}",
            completions=tuple(
                ScoredCompletion(f"a{n}.{i}", r, "stop") for i, r in enumerate(rewards)
            ),
            tokenizer_id="theirs",
            producer=producer,
            token_source=TokenSource.TEXT,
        )
    return tuple(fresh), scored


def _select(limits: Thresholds | None) -> tuple[Any, _CountingTokenizer, dict[str, ScoredGroup]]:
    fresh, scored = _candidates()
    tokenizer = _CountingTokenizer()
    learner = SimpleNamespace(
        score_external=lambda group: scored[group.producer],
        model=_NoModel(),
        tokenizer=tokenizer,
        tokenizer_id="ours",
        settings=SimpleNamespace(node_index=0, chat_template=False, sampling=SAMPLING),
        trainer=SimpleNamespace(bf16=False),
    )
    # topk scores every candidate before it picks J = 1 of them
    training = TrainingSpec(local=1, external=1, sampler="topk")
    choice = select_groups(
        learner,  # type: ignore[arg-type]
        training,
        0,
        local=[],
        fresh=fresh,
        newest={},
        limits=limits,
    )
    return choice, tokenizer, scored


def _texts(group: ScoredGroup) -> set[str]:
    return {group.prompt, *(c.text for c in group.completions)}


def test_with_the_defences_off_only_the_chosen_candidate_is_tokenised_and_none_is_run() -> None:
    choice, tokenizer, scored = _select(limits=None)
    assert choice.selection.scored == 5
    assert choice.selection.dropped_uninformative == 2
    [chosen] = choice.external
    assert set(tokenizer.calls) == _texts(scored[chosen.producer])
    assert set(tokenizer.calls.values()) == {1}
    assert chosen.scored.token_source is TokenSource.RECEIVER
    assert chosen.scored.prompt_token_ids is not None


def test_with_the_size_bound_on_every_scored_candidate_is_tokenised_once() -> None:
    limits = Thresholds(families={}, max_tokens=100, plausibility=False, length_guard=False)
    choice, tokenizer, scored = _select(limits)
    [chosen] = choice.external
    completions = {c.text for g in scored.values() for c in g.completions}
    # Every completion read by the size bound, the chosen prompt by the trainer's group;
    # nothing twice (the trainer's ids are the ones the bound read).
    assert set(tokenizer.calls) == completions | {scored[chosen.producer].prompt}
    assert set(tokenizer.calls.values()) == {1}
