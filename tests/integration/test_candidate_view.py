"""One view of each external candidate: a real node (tiny model, defences and the F-TIS
ratio filter on) runs each external completion through its model at most once per round
outside the gradient step, and the trainer gets the receiver's own token ids."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from eth_account import Account
from msgspec.structs import replace

from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.admission import NodeDefences, build_collector
from sapo_async.node.filters import RatioFilter
from sapo_async.node.groups import to_rollout_group
from sapo_async.node.learner import build_learner
from sapo_async.node.rounds import RoundLoop
from sapo_async.node.spec import NodeSpec
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.wire import Completion, keccak256
from sapo_async.wire.signing import encode_signed, sign_group

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SWARM = "one-view"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _node(index: int, broker: MemoryBroker, ratio: RatioFilter | None) -> RoundLoop:
    account = Account.from_key(keccak256(f"one-view:{index}".encode()))
    spec = NodeSpec.build(
        swarm=SWARM,
        model="tiny",
        regime="dense",
        questions_per_round=2,
        completions_per_question=4,
        local=2,
        external=2,
        ledger_enabled=False,
        name=f"n{index}",
        node_index=index,
        account=account,
        external_filter=ratio,
    )
    transport = broker.connect(SWARM)
    learner = build_learner(spec)
    defences = NodeDefences.build(spec, learner.tasks.families)
    return RoundLoop(
        spec,
        name=f"n{index}",
        learner=learner,
        publisher=Publisher(transport, account),
        collector=build_collector(spec, transport, defences, own_address=account.address),
        defences=defences,
        offload=False,
    )


@pytest.mark.timeout(300)
async def test_each_external_completion_is_run_through_the_model_at_most_once_per_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = MemoryBroker()
    ratio = RatioFilter(cap=1e6)  # on, and lets everything through to the trainer
    node, peer = _node(0, broker, ratio), _node(1, broker, None)
    tok = peer.learner.tokenizer
    external_completions = 0
    for g in await peer.learner.generate(0):
        wire = to_rollout_group(
            g,
            swarm=SWARM,
            producer=peer.address,
            producer_round=0,
            policy_version=0,
            model_id=peer.learner.model_id,
            tokenizer_id=peer.learner.tokenizer_id,
        )
        # Right and wrong answers (informative, so every check runs), with the peer's own
        # token ids and made-up behaviour log-probs of the right length.
        texts = [f" <answer>{a}</answer>" for a in (wire.answer, "77", wire.answer, "77")]
        comps = []
        for text in texts:
            ids = (*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id)
            comps.append(Completion(text, "stop", ids, tuple([-0.5] * len(ids))))
        forged = replace(wire, completions=tuple(comps))
        signed = encode_signed(sign_group(peer.publisher._account, forged))  # type: ignore[attr-defined]
        assert node.collector.ingest(signed) is not None
        external_completions += len(comps)

    rows: list[int] = []
    model = node.learner.model
    real_forward = model.forward
    in_step = False

    def counting(*args: Any, **kwargs: Any) -> Any:
        if not in_step and not torch.is_grad_enabled():
            rows.append(int(kwargs.get("input_ids", args[0] if args else None).shape[0]))
        return real_forward(*args, **kwargs)

    real_train = node.learner.train
    trained: list[Any] = []

    def train(groups: Any) -> Any:
        nonlocal in_step
        trained.extend(groups)
        in_step = True
        try:
            return real_train(groups)
        finally:
            in_step = False

    monkeypatch.setattr(node.learner, "train", train)
    shared = await node.share_round()
    # Counted from here: the node's own generation is not an external completion's pass.
    monkeypatch.setattr(model, "forward", counting)
    report = await node.train_round(shared)

    assert report.external_total == 2
    assert len(ratio.log_ratios) == external_completions  # the filter measured them all
    assert 0 < sum(rows) <= external_completions
    external = [g for g in trained if g.producer == peer.address]
    assert len(external) == 2
    assert all(g.token_source is TokenSource.RECEIVER for g in external)
    assert report.step["retokenised"] == 0  # the peer's ids were the text's own tokens
