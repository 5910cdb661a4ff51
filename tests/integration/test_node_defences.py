"""A real node (tiny model, real reasoning-gym, real verifier) against hostile peers' groups:
failed groups are dropped once, absurd configs and huge prompts cost nothing, the buffer is
only touched from the event loop, a trained hash never comes back.

What is asserted holds on any CPU. The plausibility check and the length and brevity
guards compare a peer's completion with thresholds calibrated on the node's own *sampled*
completions, and sampling differs between CPUs (floating point, issue 54): whether a forged
right answer passes them is one draw's outcome. The tests below whose subject is
another defence (the repetition check, the cut after the answer, the stock-lead record, a
trained hash) therefore turn those three off (:data:`UNCALIBRATED`), so what they train is
fixed by their fixed texts and the node's own verifier; the calibrated screens are tested
on fixed thresholds in tests/unit/test_defence.py and on SmolLM2 in test_real_defence.py."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from msgspec.structs import replace

from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.limits import QUARANTINE_MIN_EVENTS
from sapo_async.node.rounds import RoundLoop
from sapo_async.node.selection import candidate_view
from sapo_async.tasks import source as task_source
from sapo_async.tasks.spec import canonical_config_json, config_digest
from sapo_async.wire import Completion, RolloutGroup, TaskRef
from sapo_async.wire.signing import encode_signed, sign_group
from tests.fixtures.learning import peer_wire_groups, two_node_round_loop, vouched

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SWARM = "defences"

UNCALIBRATED: dict[str, Any] = {
    "plausibility": False,
    "length_guard": False,
    "brevity_guard": False,
}
"""The defences whose verdict depends on thresholds calibrated on sampled own completions."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _node(index: int, broker: MemoryBroker, *, offload: bool = False, **kw: Any) -> RoundLoop:
    node: RoundLoop = await two_node_round_loop(
        SWARM, index, broker, offload=offload, max_staleness_rounds=4, **kw
    )
    return node


async def _peer_groups(peer: RoundLoop) -> list[RolloutGroup]:
    groups: list[RolloutGroup] = await peer_wire_groups(peer)
    return groups


def _signed(peer: RoundLoop, group: RolloutGroup) -> bytes:
    return encode_signed(sign_group(peer.publisher._account, group))  # type: ignore[attr-defined]


@pytest.mark.timeout(300)
async def test_a_group_that_fails_scoring_is_dropped_once_not_rescored_every_round() -> None:
    broker = MemoryBroker()
    node, peer = await _node(0, broker), await _node(1, broker)
    good = await _peer_groups(peer)
    # Claims an answer the re-derived task does not have: fails scoring (task_mismatch).
    lying = replace(good[0], answer=good[0].answer + "0")
    assert node.collector.ingest(_signed(peer, lying)) is not None
    first = await node.train_round(await node.share_round())
    assert first.external_failed == {"task_mismatch": 1}
    assert node.collector.statistics().buffered == 0
    assert node.collector.statistics().dropped == {"task_mismatch": 1}
    second = await node.train_round(await node.share_round())
    assert second.external_failed == {}
    assert first.rejections == {"task_mismatch": 1}
    assert second.rejections == {}


@pytest.mark.timeout(300)
async def test_an_absurd_config_is_refused_before_its_task_is_derived(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = MemoryBroker()
    node, peer = await _node(0, broker), await _node(1, broker)
    good = (await _peer_groups(peer))[0]
    derived: list[str] = []
    real = task_source._dataset

    def spy(family: str, config_json: str, seed: int) -> Any:
        derived.append(config_json)
        return real(family, config_json, seed)

    monkeypatch.setattr(task_source, "_dataset", spy)
    config = canonical_config_json(
        {"min_terms": 8000, "max_terms": 8000, "min_digits": 1, "max_digits": 2}
    )
    ref = TaskRef(good.task.family, config_digest(config), good.task.seed, good.task.index)
    absurd = replace(good, task=ref, task_config=config)
    assert node.collector.ingest(_signed(peer, absurd)) is None
    # Cost nothing: refused without deriving its 8000-term task (counted, not timed: a
    # wall-clock bound depends on the machine and its load).
    assert derived == []
    assert node.collector.statistics().rejected == {"task_outside_preset": 1}
    report = await node.train_round(await node.share_round())
    assert config not in derived
    assert report.external_failed == {}


@pytest.mark.timeout(300)
async def test_a_huge_question_or_completion_is_refused_at_admission() -> None:
    broker = MemoryBroker()
    node, peer = await _node(0, broker), await _node(1, broker)
    good = (await _peer_groups(peer))[0]
    huge_question = replace(good, question="1 + " * 20_000 + "1")
    huge_completion = replace(
        good, completions=(Completion(text="<answer>" * 5_000, finish_reason="length"),) * 4
    )
    assert node.collector.ingest(_signed(peer, huge_question)) is None
    assert node.collector.ingest(_signed(peer, huge_completion)) is None
    assert node.collector.statistics().rejected == {
        "prompt_too_long": 1,
        "completion_too_long": 1,
    }


@pytest.mark.timeout(300)
async def test_selection_in_a_worker_thread_never_touches_the_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The flood crash: selection ran in a worker thread and iterated and removed from the
    # collector's buffer while the event loop inserted into it.
    broker = MemoryBroker()
    node, peer = await _node(0, broker, offload=True), await _node(1, broker)
    for g in await _peer_groups(peer):
        assert node.collector.ingest(_signed(peer, g)) is not None
    callers: list[int] = []
    for name in ("candidates", "take", "drop", "mark_trained"):
        original = getattr(Collector, name, None)
        if original is None:
            continue

        def spy(self: Collector, *a: Any, _original: Any = original, **kw: Any) -> Any:
            callers.append(threading.get_ident())
            return _original(self, *a, **kw)

        monkeypatch.setattr(Collector, name, spy)
    loop_thread = threading.get_ident()
    await node.train_round(await node.share_round())
    assert callers
    assert set(callers) == {loop_thread}


@pytest.mark.timeout(300)
async def test_a_group_trained_on_is_never_admitted_again() -> None:
    broker = MemoryBroker()
    # Right and wrong answers, judged by the verifier alone: every group is trained.
    node, peer = await _node(0, broker, **UNCALIBRATED), await _node(1, broker)
    vouched(node, peer)
    groups = [
        replace(
            g,
            completions=tuple(
                Completion(text=f" <answer>{a}</answer>", finish_reason="stop")
                for a in (g.answer, "77", g.answer, "77")
            ),
        )
        for g in await _peer_groups(peer)
    ]
    wires = [_signed(peer, g) for g in groups]
    for data in wires:
        assert node.collector.ingest(data) is not None
    report = await node.train_round(await node.share_round())
    assert report.external_total == min(len(groups), 2)  # J = 2
    for data in wires:
        node.collector.ingest(data)
    rejected = node.collector.statistics().rejected
    assert rejected.get("already_trained", 0) == report.external_total


@pytest.mark.timeout(300)
async def test_token_ids_that_are_not_the_texts_own_tokens_are_dropped() -> None:
    # A same-tokenizer peer's token ids are what the trainer uses: text that passes every
    # check must not carry other tokens.
    broker = MemoryBroker()
    node, peer = await _node(0, broker), await _node(1, broker)
    tok = node.learner.tokenizer
    group = (await _peer_groups(peer))[0]
    right, wrong = f" <answer>{group.answer}</answer>", " <answer>77</answer>"
    payload = tuple(tok(" <answer>1</answer> (*)(*)", add_special_tokens=False)["input_ids"])
    completions = tuple(
        Completion(
            text=text,
            finish_reason="stop",
            token_ids=payload if text == right else None,
            logprobs=tuple([-0.1] * len(payload)) if text == right else None,
        )
        for text in (right, wrong, right, wrong)
    )
    forged = replace(group, completions=completions)
    assert node.collector.ingest(_signed(peer, forged)) is not None
    report = await node.train_round(await node.share_round())
    assert report.external_failed == {"token_mismatch": 1}
    assert report.external_total == 0


@pytest.mark.timeout(300)
async def test_an_overlong_low_reward_completion_still_drops_its_group() -> None:
    # The absurd attack's crafted groups: plausible right answers beside hundreds of
    # unclosed tags at reward 0. Only rewarded completions are screened for plausibility,
    # but the trainer runs every completion, so the size bound covers them all.
    broker = MemoryBroker()
    node, peer = await _node(0, broker), await _node(1, broker)
    group = (await _peer_groups(peer))[0]
    right, crafted = f" <answer>{group.answer}</answer>", " " + "<answer>" * 400
    forged = replace(
        group,
        completions=tuple(
            Completion(text=t, finish_reason="stop") for t in (right, crafted, right, crafted)
        ),
    )
    assert node.collector.ingest(_signed(peer, forged)) is not None
    report = await node.train_round(await node.share_round())
    assert report.external_failed == {"completion_too_many_tokens": 1}
    assert report.external_total == 0


@pytest.mark.timeout(300)
async def test_an_honest_peer_of_the_same_model_always_passes_the_token_check() -> None:
    # Seen from outside: 10 of 12 honest groups dropped after admission were token_mismatch.
    # The tiny model puts some mass on <unk> and <pad>; a sampled one vanished from the
    # decoded text, so the ids were no longer the text's. At temperature 2 (a legal
    # setting, and where it happens often) every honest run must still pass.
    broker = MemoryBroker()
    node = await _node(0, broker)
    peer = await _node(1, broker, temperature=2.0)
    checked = 0
    for producer_round in range(8):
        for wire in await peer_wire_groups(peer, producer_round):
            scored = node.learner.score_external(wire)
            view = candidate_view(node.learner, scored, cut_after_answer=True)  # the default
            for i, c in enumerate(wire.completions):
                assert c.token_ids is not None
                assert view.peer_ids_match(i), (c.text, c.token_ids)
                checked += 1
    assert checked == 8 * 2 * 4


@pytest.mark.timeout(300)
async def test_another_models_groups_wait_until_the_node_has_calibrated_their_family() -> None:
    """Issue 23: a node trained on peers' groups of a family it had not calibrated yet,
    unscreened (SmolLM2's first four rounds took an attacker's payload that way). A peer of
    another model is judged by the calibrated floors, so its groups stay in the buffer,
    neither dropped nor trained on, until the family is calibrated."""
    broker = MemoryBroker()
    # B x L = 8 own completions a round: the family is calibrated after the second round.
    node, peer = await _node(0, broker, calibration_min=16), await _node(1, broker)
    vouched(node, peer)
    good = [replace(g, model_id="another-model") for g in await _peer_groups(peer)]
    for g in good:
        assert node.collector.ingest(_signed(peer, g)) is not None
    first = await node.train_round(await node.share_round())
    assert first.external_held == len(good)
    assert first.external_held_by == {"uncalibrated": len(good)}
    assert first.external_total == 0
    assert first.external_failed == {}
    assert node.collector.statistics().buffered == len(good)
    assert node.collector.statistics().dropped == {}
    second = await node.train_round(await node.share_round())
    assert second.external_held == 0
    assert second.external_scored > 0


@pytest.mark.timeout(300)
async def test_a_peer_of_the_nodes_model_is_judged_from_the_first_round() -> None:
    """Issue 57: the calibration hold cost honest sharing (with no attack, SmolLM2's 1/1
    swarm trained 47 external groups with the defences on against 78 off). A peer of the
    node's own model is judged by the per-token test, which needs no calibration: its
    groups are screened in the round they arrive."""
    broker = MemoryBroker()
    node, peer = await _node(0, broker, calibration_min=16), await _node(1, broker)
    vouched(node, peer)
    good = await _peer_groups(peer)
    assert {g.model_id for g in good} == {node.learner.model_id}
    for g in good:
        assert node.collector.ingest(_signed(peer, g)) is not None
    first = await node.train_round(await node.share_round())
    assert first.external_held == 0
    assert first.external_scored > 0


@pytest.mark.timeout(300)
async def test_a_right_answer_padded_with_a_repeated_pattern_drops_its_group() -> None:
    """Issue 23: the length attack pads the right answer with ``" ."`` to the cap. The pad
    is likely under the model once seen twice, and at a 32-token cap it is within the
    length guard, so honest SmolLM2 nodes learned it (honest reward 0.29 of no attack).
    The repetition check drops the group; the same answers unpadded are trained on."""
    broker = MemoryBroker()
    # Room for the pad under the size bound (it is the round's own cap).
    # The calibrated screens off: the repetition check (no calibration) alone tells the
    # padded answer from the same answer unpadded.
    node = await _node(0, broker, max_new_tokens=48, **UNCALIBRATED)
    peer = vouched(node, await _node(1, broker))
    group = (await _peer_groups(peer))[0]
    right, wrong = f" <answer>{group.answer}</answer>", " <answer>77</answer>"
    padded = " ." * 6 + right  # the tiny tokenizer: a token a character, 12 tokens of pad

    def with_texts(first: str, producer_round: int) -> RolloutGroup:
        texts = (first, wrong, first, wrong)
        return replace(
            group,
            producer_round=producer_round,
            completions=tuple(Completion(text=t, finish_reason="stop") for t in texts),
        )

    assert node.collector.ingest(_signed(peer, with_texts(padded, group.producer_round)))
    report = await node.train_round(await node.share_round())
    assert report.external_failed == {"repetitive": 1}
    assert report.external_total == 0
    assert node.collector.ingest(_signed(peer, with_texts(right, group.producer_round + 1)))
    report = await node.train_round(await node.share_round())
    assert report.external_failed == {}
    assert report.external_total == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cut", [True, False])
async def test_a_payload_after_the_answer_is_not_trained_on_with_the_cut(
    cut: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: the tokens attack (the right answer, then a run of digits and operators)
    passed the plausibility floor on SmolLM2 and reached 13 % of honest completions with
    the defences on. With ``cut_after_answer`` the trainer gets the right answer and not the
    run, at the same reward; without it, the run is trained on."""
    broker = MemoryBroker()
    # The calibrated screens off: the cut alone decides what is trained, whatever the tiny
    # model thinks of the run (and however brief the node's own answers were).
    node = await _node(0, broker, cut_after_answer=cut, **UNCALIBRATED)
    peer = vouched(node, await _node(1, broker))
    group = (await _peer_groups(peer))[0]
    right, wrong = f" <answer>{group.answer}</answer>", " <answer>77</answer>"
    texts = (right + " 7*(3=", wrong, right + " 7*(3=", wrong)
    forged = replace(
        group, completions=tuple(Completion(text=t, finish_reason="stop") for t in texts)
    )
    trained: list[Any] = []
    real_train = node.learner.train
    monkeypatch.setattr(node.learner, "train", lambda gs: trained.extend(gs) or real_train(gs))
    assert node.collector.ingest(_signed(peer, forged)) is not None
    report = await node.train_round(await node.share_round())
    assert report.external_total == 1
    (external,) = [g for g in trained if g.producer == peer.publisher._account.address]  # type: ignore[attr-defined]
    tokenizer = node.learner.tokenizer
    for c, sent in zip(external.completions, texts, strict=True):
        spelled = tokenizer.decode(list(c.token_ids), skip_special_tokens=True)
        assert ("7*(3=" in spelled) is (sent != wrong and not cut)
        assert ("7*(3=" in c.text) is (sent != wrong and not cut)
    assert [c.reward for c in external.completions] == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("share", "probation"), [(0.5, False), (0.5, True), (0.0, False)])
async def test_a_peer_that_shows_the_same_filler_before_every_right_answer_stops_being_trained(
    share: float, probation: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: the filler attacker (its right answers behind ``The answer is``, beside
    bare wrong ones) passes the brevity guard, and on SmolLM2 its groups were trained and
    the filler spread (docs/security.md). The node's lead record leaves out a peer's
    completions showing one lead on three or more questions once 8 of its rewarded
    answers showed it; with probation none is trained before that; with
    ``stock_lead_share`` 0 every such group is trained."""
    broker = MemoryBroker()
    # The calibrated screens off: the stock-lead record alone leaves the filler out.
    node = await _node(
        0, broker, stock_lead_share=share, stock_lead_probation=probation, **UNCALIBRATED
    )
    peer = vouched(node, await _node(1, broker))
    address = peer.publisher._account.address  # type: ignore[attr-defined]
    trained: list[Any] = []
    real_train = node.learner.train
    monkeypatch.setattr(node.learner, "train", lambda gs: trained.extend(gs) or real_train(gs))
    per_round, questions, left_out = [], set(), Counter[str]()
    for round_ in range(4):
        for group in await peer_wire_groups(peer, round_):
            questions.add(group.task)
            # The tiny model's cap is a few dozen characters: a short filler, same shape.
            right, wrong = f" So: <answer>{group.answer}</answer>", " <answer>77</answer>"
            texts = (right, wrong, right, wrong)
            forged = replace(
                group, completions=tuple(Completion(text=t, finish_reason="stop") for t in texts)
            )
            assert node.collector.ingest(_signed(peer, forged)) is not None
        before = len(trained)
        report = await node.train_round(await node.share_round())
        left_out.update(report.external_left_out.get(address, {}))
        per_round.append(sum(g.producer == address for g in trained[before:]))
    assert len(questions) == 8  # two new questions a round
    if share:
        # What the record left out is in the round reports (and the node's metrics): both
        # filler answers of each of the peer's groups the draw scored once it was flagged.
        assert set(left_out) == {"stock_lead"}
        assert left_out["stock_lead"] > 0
        assert left_out["stock_lead"] % 2 == 0
        assert node.leads is not None
        assert node.leads.stock(address) == "so"
        # Flagged in round 1, once 8 of its rewarded answers showed the lead: never again;
        # on probation its first groups wait for that verdict and are never trained.
        assert per_round == ([0, 0, 0, 0] if probation else [2, 1, 0, 0])
    else:
        assert node.leads is None
        assert per_round == [2, 2, 2, 2]
        assert not left_out


@pytest.mark.timeout(300)
async def test_a_new_peers_groups_are_judged_before_any_of_them_is_trained() -> None:
    """Issue 57: with nothing held, a trigger attacker's groups that fit the token cap were
    trained in its first rounds, before the refusals of its other groups had quarantined it.
    A node trains a producer's groups only once its quarantine has judged the producer (its
    first decision made in the producer's favour); until then it judges each of the
    producer's groups once, for the count, and trains none."""
    broker = MemoryBroker()
    node = await _node(0, broker, **UNCALIBRATED)
    peer = await _node(1, broker)
    address = peer.publisher._account.address  # type: ignore[attr-defined]
    sent, trained_from = 0, None
    for round_ in range(6):
        for group in await peer_wire_groups(peer, round_):
            right, wrong = f" <answer>{group.answer}</answer>", " <answer>77</answer>"
            texts = (right, wrong, right, wrong)  # informative, and passes every stage
            forged = replace(
                group, completions=tuple(Completion(text=t, finish_reason="stop") for t in texts)
            )
            assert node.collector.ingest(_signed(peer, forged)) is not None
            sent += 1
        cleared_before = node.quarantine.evidence([address]).cleared(address)
        report = await node.train_round(await node.share_round())
        cleared = node.quarantine.evidence([address]).cleared(address)
        if not cleared:
            # Not judged yet: every group judged once, held, none trained.
            assert report.external_total == 0
            assert report.external_held_by == {"evidence": sent}
            short = node.quarantine.evidence([address]).short(address)
            assert QUARANTINE_MIN_EVENTS - short == sent
        elif trained_from is None and report.external_total:
            trained_from = round_
            assert not cleared_before  # cleared in this round, and drawn in it
    assert trained_from is not None
    assert not node.quarantine.blocked(address)
