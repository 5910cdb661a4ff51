"""Completion-token log-probs: chunked over the vocabulary head, equal to the naive path.

The trainer-level equality (loss and gradients against a record of the old path) is in
``test_grpo_reference.py``; here, the pieces: the head never sees more positions at once
than a chunk, the fallback for models without a separable head gives the same values, and
micro-batches respect their token budget.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sapo_async.policy.grpo.batch import Row, _by_budget
from sapo_async.policy.grpo.logprobs import token_logprobs
from sapo_async.policy.grpo.trainer import Trainer, TrainerConfig
from tests.unit.test_grpo_reference import _model, _tokenizer, groups


def _batch() -> tuple[Any, Any, Any]:
    tok = _tokenizer()
    model = _model(tok)
    trainer = Trainer(model, tok, TrainerConfig(max_completion_tokens=24), add_special_tokens=False)
    rows, _ = trainer._batcher.rows(groups(tok))
    return model, trainer._batcher.collate(rows, torch.device("cpu")), rows


def _naive(model: Any, batch: Any) -> torch.Tensor:
    """The old path: full-vocabulary log_softmax at every position of the batch."""
    logits = model(input_ids=batch.ids, attention_mask=batch.attn).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
    return logp * batch.comp_mask


def test_the_vocabulary_head_never_sees_more_positions_than_a_chunk() -> None:
    model, batch, _ = _batch()
    seen: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
    logp, _ = token_logprobs(model, batch, chunk_tokens=6)
    logp.sum().backward()
    n = int(batch.comp_mask.sum())
    assert n > 40
    assert max(seen) == 6  # forward chunks, and the same chunks recomputed in backward
    assert sum(seen) == 2 * n
    assert torch.allclose(logp.detach(), _naive(model, batch).detach(), atol=1e-6)


def test_a_model_without_a_separable_head_gets_the_same_log_probs() -> None:
    model, batch, _ = _batch()

    class Opaque(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **kw: Any) -> Any:
            return self.inner(**kw)

    chunked, ent = token_logprobs(model, batch, entropy=True, chunk_tokens=7)
    opaque, ent2 = token_logprobs(Opaque(model), batch, entropy=True, chunk_tokens=7)
    assert torch.allclose(chunked, opaque, atol=1e-6)
    assert ent == pytest.approx(ent2, rel=1e-6)
    assert ent > 0


def test_micro_batches_keep_row_order_and_fit_the_budget_unless_one_row_is_longer() -> None:
    rows = [Row([1] * p, [2] * c, None, 0.0) for p, c in [(3, 2), (3, 5), (2, 1), (10, 10), (1, 1)]]
    runs = _by_budget(rows, 16)
    assert [len(r) for r in runs] == [2, 1, 1, 1]
    assert [row for run in runs for row in run] == rows
    for run in runs:
        width = max(len(r.prompt) + len(r.completion) for r in run)
        assert len(run) == 1 or width * len(run) <= 16
    assert _by_budget(rows, None) == [rows]
