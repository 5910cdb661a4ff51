"""The candidate view's log-probs live on the model's device and are computed once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from sapo_async.node.view import CandidateView
from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup, TokenSource

VOCAB = 11


class _Tokenizer:
    eos_token_id = 10
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [1 + (ord(ch) % 9) for ch in text]}


class _Model(torch.nn.Module):
    """A causal LM of one parameter, on ``device``; records its inputs' devices."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(VOCAB, VOCAB, device=device))
        self.seen: list[tuple[torch.device, int]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        self.seen.append((input_ids.device, int(input_ids.shape[0])))
        return SimpleNamespace(logits=self.weight[input_ids])


def _view(model: _Model) -> CandidateView:
    group = ScoredGroup(
        prompt="2+2",
        completions=(
            ScoredCompletion("4", 1.0, "stop", token_ids=(5, 10)),
            ScoredCompletion("5", 0.0, "length"),
            ScoredCompletion("44", 1.0, "stop"),
        ),
        tokenizer_id="tok",
        producer="0xpeer",
    )
    return CandidateView(
        group, model=model, tokenizer=_Tokenizer(), tokenizer_id="tok", add_special_tokens=False
    )


def test_the_views_log_probs_are_on_the_models_device() -> None:
    model = _Model("meta")  # no GPU here: meta is a device other than the CPU's
    view = _view(model)
    lps = view.logprobs([0, 2])
    assert {lp.device.type for lp in lps} == {"meta"}
    assert {device.type for device, _ in model.seen} == {"meta"}
    assert [lp.shape[0] for lp in lps] == [len(view.token_ids[0]), len(view.token_ids[2])]


def test_each_completion_is_run_once_however_often_it_is_asked_for() -> None:
    model = _Model("cpu")
    view = _view(model)
    first = view.logprobs([0])
    view.logprobs([0, 1])
    view.logprobs([2, 1, 0])
    assert [rows for _, rows in model.seen] == [1, 1, 1]
    assert torch.equal(view.logprobs([0])[0], first[0])


def test_the_trainer_gets_the_receivers_own_ids_and_only_matching_behaviour_log_probs() -> None:
    view = _view(_Model("cpu"))
    assert view.token_ids[0] == (1 + ord("4") % 9, 10)
    trained = view.trained_group()
    assert trained.token_source is TokenSource.RECEIVER
    assert [c.token_ids for c in trained.completions] == list(view.token_ids)
    assert trained.prompt_token_ids == view.prompt_ids
    # The peer's (5, 10) are not the text's own tokens: its behaviour log-probs (none
    # here) could not be kept, and the ids trained on are the receiver's.
    assert not view.peer_ids_match(0)
    assert all(c.behaviour_logprobs is None for c in trained.completions)
