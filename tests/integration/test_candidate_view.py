"""One view of each external candidate: a real node (tiny model, defences and the F-TIS
ratio filter on) runs each external completion through its model at most once per round
outside the gradient step, and the trainer gets the receiver's own token ids."""

from __future__ import annotations

from typing import Any

import pytest
from msgspec.structs import replace

from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node import view as view_module
from sapo_async.node.filters import RatioFilter
from sapo_async.node.rounds import RoundLoop
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.wire import Completion
from sapo_async.wire.signing import encode_signed, sign_group
from tests.fixtures.learning import peer_wire_groups, two_node_round_loop, vouched

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SWARM = "one-view"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _node(index: int, broker: MemoryBroker, ratio: RatioFilter | None) -> RoundLoop:
    node: RoundLoop = await two_node_round_loop(SWARM, index, broker, external_filter=ratio)
    return node


@pytest.mark.timeout(300)
async def test_each_external_completion_is_run_through_the_model_at_most_once_per_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = MemoryBroker()
    ratio = RatioFilter(cap=1e6)  # on, and lets everything through to the trainer
    node, peer = await _node(0, broker, ratio), await _node(1, broker, None)
    vouched(node, peer)
    tok = peer.learner.tokenizer
    external_completions = 0
    for wire in await peer_wire_groups(peer):
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

    # every pass the round spends on external completions goes through the view's one
    # batched call (node/plausibility.py: the prompt once, then the rows after it)
    rows: list[int] = []
    real_view = view_module.token_tests_batch

    def counting(model: Any, prompt: Any, batch: Any, **kwargs: Any) -> Any:
        if not in_step:
            rows.append(len(batch))
        return real_view(model, prompt, batch, **kwargs)

    in_step = False
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
    monkeypatch.setattr(view_module, "token_tests_batch", counting)
    report = await node.train_round(shared)

    assert report.external_total == 2
    assert len(ratio.log_ratios) == external_completions  # the filter measured them all
    assert 0 < sum(rows) <= external_completions
    external = [g for g in trained if g.producer == peer.address]
    assert len(external) == 2
    assert all(g.token_source is TokenSource.RECEIVER for g in external)
    assert report.step["retokenised"] == 0  # the peer's ids were the text's own tokens
