"""``[model] train_layers``: only the last N blocks and the final norm train."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sapo_async.errors import ConfigError
from sapo_async.policy.models import train_last_layers


def _model(layers: int = 3) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def test_only_last_blocks_and_final_norm_get_gradients() -> None:
    model = _model(3)
    trainable = train_last_layers(model, 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    out = model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]]))
    out.loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed, "the step changed nothing"
    assert all(n.startswith(("model.layers.2.", "model.norm.")) for n in changed), changed
    assert "model.norm.weight" in changed
    assert not any(n.startswith(("model.embed_tokens", "model.layers.0.")) for n in changed)
    expected = sum(p.numel() for p in model.model.layers[2].parameters()) + sum(
        p.numel() for p in model.model.norm.parameters()
    )
    assert trainable == expected


def test_all_blocks_leave_only_the_embeddings_frozen() -> None:
    model = _model(2)
    train_last_layers(model, 2)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"model.embed_tokens.weight"}


def test_more_layers_than_the_model_has_is_refused_with_the_allowed_range() -> None:
    message = r"train_layers = 5: the model has 3 blocks; allowed 1 to 3"
    with pytest.raises(ConfigError, match=message):
        train_last_layers(_model(3), 5)
