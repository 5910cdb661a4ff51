"""The trainer's metrics count what the batcher trusted: a group is external by its token
source (``TokenSource``), never by the spelling of its producer."""

from __future__ import annotations

import pytest
import torch

from sapo_async.policy.grpo import ScoredCompletion, ScoredGroup, Trainer
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.policy.models import train_char_tokenizer


def _group(producer: str, source: TokenSource) -> ScoredGroup:
    # Equal rewards: uninformative, so the step is skipped and no model is ever run.
    same = (ScoredCompletion("4", 1.0), ScoredCompletion("4", 1.0))
    return ScoredGroup("2+2=", same, producer=producer, token_source=source)


def test_external_groups_are_counted_by_token_source_not_by_the_producers_name() -> None:
    tok = train_char_tokenizer(["2+2=4 0123456789"])
    trainer = Trainer(torch.nn.Linear(1, 1), tok)
    groups = [
        _group("node-0", TokenSource.SAMPLED),  # our own, under a node's name
        _group("0xself", TokenSource.SAMPLED),
        _group("local", TokenSource.RECEIVER),  # a peer's, whatever it calls itself
        _group("0xpeer", TokenSource.TEXT),
    ]
    metrics = trainer.step(groups)
    assert metrics.skipped
    assert metrics.external_groups == 2
    assert [g.external for g in groups] == [False, False, True, True]


def test_a_scored_group_without_a_token_source_is_refused() -> None:
    same = (ScoredCompletion("4", 1.0),)
    with pytest.raises(TypeError, match="token_source"):
        ScoredGroup("2+2=", same)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="token_source"):
        ScoredGroup("2+2=", same, None, None, None, "local")  # type: ignore[call-arg]


def test_a_group_named_local_with_text_ids_is_external() -> None:
    group = _group("local", TokenSource.TEXT)
    assert group.producer == "local"
    assert group.external
