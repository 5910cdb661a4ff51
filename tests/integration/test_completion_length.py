"""One completion length, from the node's settings to generation, reward and training.

``training.max_new_tokens`` caps generation; before it also set the trainer's cap, the
trainer kept its own default of 64, so on the node path a longer completion was rewarded
on its full text but trained on its first 64 tokens (and dr_grpo divided by B x 64).
"""

from __future__ import annotations

from typing import Any

import anyio
import torch

from sapo_async.node.learner import build_learner
from sapo_async.node.spec import NodeSpec
from sapo_async.policy.grpo import TrainerConfig

LENGTH = 80
"""Above the trainer's old default cap of 64."""


def _ban_eos(model: Any, eos: int) -> None:
    """Completions run to the length cap: EOS gets no probability when sampling (the hook
    is on the model's own forward, which generation calls; training calls the decoder and
    the head directly, so its log-probs are the model's)."""

    def hook(_module: Any, _args: Any, out: Any) -> Any:
        out.logits[..., eos] = torch.finfo(out.logits.dtype).min
        return out

    model.register_forward_hook(hook)


def test_every_generated_token_is_trained_on_the_node_path(tiny_lm: Any) -> None:
    # The test model declares 64 positions (the node refuses max_new_tokens at or above a
    # model's context); its rotary positions take any length, so declare room for 80 + prompt.
    tiny_lm.model.config.max_position_embeddings = 256
    spec = NodeSpec.build(
        model=tiny_lm,
        tasks="cpu_easy",
        max_new_tokens=LENGTH,
        questions_per_round=1,
        completions_per_question=2,
        local=1,
        external=0,
        # the two completions may score alike; train on them anyway
        trainer=TrainerConfig(drop_uninformative=False, skip_empty=False, loss_type="dr_grpo"),
        ledger_enabled=False,
    )
    learner = build_learner(spec)
    _ban_eos(learner.model, tiny_lm.tokenizer.eos_token_id)

    groups = anyio.run(learner.generate)
    completions = [c for g in groups for c in g.result.completions]
    assert [(c.finish_reason, len(c.token_ids or ())) for c in completions] == [
        ("length", LENGTH)
    ] * 2
    scored = learner.score_local(groups)
    assert [c.text for g in scored for c in g.completions] == [c.text for c in completions]

    step = learner.train(scored)
    assert not step.skipped
    completion_tokens_trained = step.tokens // step.sequences
    assert completion_tokens_trained == LENGTH
    assert learner.trainer.config.max_completion_tokens == LENGTH  # dr_grpo's B x LENGTH
