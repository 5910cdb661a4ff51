"""The admission pipeline: the node's checks, their stages, and one label set for reasons."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from msgspec.structs import replace

from sapo_async.errors import RejectedInput
from sapo_async.fabric.admission import Arrival, Stage
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.transport.memory import MemoryBroker
from sapo_async.node.admission import (
    NodeDefences,
    PresetCheck,
    ProducerRoundCap,
    QuarantineCheck,
    SizeBounds,
    build_collector,
)
from sapo_async.node.spec import NodeSpec
from sapo_async.tasks.source import TaskSource, dataset_seed
from sapo_async.tasks.spec import CPU_PRESET, canonical_config_json, config_digest
from sapo_async.wire import RolloutGroup, TaskRef, signing
from sapo_async.wire.reasons import RejectReason
from sapo_async.wire.rollout import encode_group
from sapo_async.wire.signing import encode_signed, sign_body, sign_group
from tests.fixtures.fabric import SWARM, make_account, make_group

ME = make_account(0)
PEER = make_account(1)
FORGER = make_account(2)
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _arrival(group: RolloutGroup) -> Arrival:
    return Arrival(group, b"\x00" * 32, None, None, 0.0, None)


def _own_group(index: int = 0) -> RolloutGroup:
    item = TaskSource(CPU_PRESET, swarm_seed=3).round_items(1, 0, 1)[0]
    return replace(
        make_group(PEER, index=index),
        task=item.ref,
        task_config=item.config_json,
        question=item.question,
        answer=item.answer,
    )


def _reason(check: object, group: RolloutGroup) -> str:
    with pytest.raises(RejectedInput) as info:
        check(_arrival(group))  # type: ignore[operator]
    return str(info.value.reason)


def test_the_preset_check_takes_own_configs_and_refuses_other_configs_and_seeds() -> None:
    check = PresetCheck.of(CPU_PRESET, dataset_seed(3))
    good = _own_group()
    check(_arrival(good))
    config = canonical_config_json({"min_terms": 8000, "max_terms": 8000})
    absurd = replace(
        good,
        task=TaskRef(good.task.family, config_digest(config), good.task.seed, 0),
        task_config=config,
    )
    other_seed = replace(good, task=replace(good.task, seed=dataset_seed(4)))
    assert _reason(check, absurd) == "task_outside_preset"
    assert _reason(check, other_seed) == "task_outside_preset"


def test_size_bounds_count_characters_of_the_question_and_of_each_completion() -> None:
    check = SizeBounds(max_prompt_chars=100, max_completion_chars=50)
    check(_arrival(_own_group()))
    assert _reason(check, replace(_own_group(), question="1 + " * 40)) == "prompt_too_long"
    assert _reason(check, make_group(PEER, text="x" * 60)) == "completion_too_long"


def test_the_producer_round_cap_counts_only_groups_the_collector_admitted() -> None:
    cap = ProducerRoundCap(3)
    group = make_group(PEER)
    for _ in range(10):
        cap(_arrival(group))  # refused later, or forged: never counted
    for _ in range(3):
        cap.admitted(_arrival(group))
    assert _reason(cap, group) == "producer_round_flood"
    cap(_arrival(replace(group, producer_round=1)))  # a new round starts a new count


def _wire(group: RolloutGroup, account=PEER) -> bytes:  # type: ignore[no-untyped-def]
    return encode_signed(sign_group(account, group))


def test_forged_groups_refused_before_the_signature_cost_no_recovery_nor_an_honest_quota(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recovered: list[bytes] = []
    real = signing.recover_signer
    monkeypatch.setattr(signing, "recover_signer", lambda h, s: recovered.append(h) or real(h, s))
    cap = ProducerRoundCap(2)
    collector = Collector(
        MemoryBroker().connect(SWARM),
        own_address=ME.address,
        checks=[SizeBounds(10_000, 100), cap],
    )
    # Oversized completions are refused on the claim: no signature is recovered for them.
    assert collector.ingest(_wire(make_group(PEER, text="x" * 200, index=9))) is None
    assert recovered == []
    # A forger's groups claiming PEER fail the signature and do not use up PEER's cap.
    for i in range(5):
        forged = encode_signed(sign_body(FORGER, encode_group(make_group(PEER, index=i))))
        assert collector.ingest(forged) is None
    assert collector.ingest(_wire(make_group(PEER, index=10))) is not None
    assert collector.ingest(_wire(make_group(PEER, index=11))) is not None
    assert collector.ingest(_wire(make_group(PEER, index=12))) is None
    assert collector.statistics().rejected == {
        "completion_too_long": 1,
        "signer_mismatch": 5,
        "producer_round_flood": 1,
    }


def test_admission_refusals_do_not_feed_the_quarantine() -> None:
    spec = NodeSpec.build(swarm=SWARM, ledger_enabled=False, max_completion_chars=10)
    defences = NodeDefences.build(spec, CPU_PRESET)
    collector = build_collector(
        spec, MemoryBroker().connect(SWARM), defences, own_address=ME.address
    )
    for i in range(40):
        assert collector.ingest(_wire(make_group(PEER, text="x" * 20, index=i))) is None
    assert sum(collector.statistics().rejected.values()) == 40
    assert defences.quarantine.active() == []
    assert not defences.quarantine.blocked(PEER.address)


def test_the_node_pipeline_puts_quarantine_first_and_every_node_check_before_the_signature() -> (
    None
):
    spec = NodeSpec.build(swarm=SWARM, ledger_enabled=False, extra_check=lambda g: None)
    checks = NodeDefences.build(spec, CPU_PRESET).checks
    kinds = [type(c).__name__ for c in checks]
    assert kinds == [
        "QuarantineCheck",
        "PresetCheck",
        "SizeBounds",
        "ProducerRoundCap",
        "GroupCheck",
    ]
    assert [c.stage for c in checks] == [Stage.BEFORE_SIGNATURE] * 4 + [Stage.AFTER_SIGNATURE]
    assert isinstance(checks[0], QuarantineCheck)


def test_defences_off_leave_only_the_operators_check() -> None:
    spec = NodeSpec.build(
        swarm=SWARM, ledger_enabled=False, defence_active=False, extra_check=lambda g: None
    )
    assert [type(c).__name__ for c in NodeDefences.build(spec, CPU_PRESET).checks] == ["GroupCheck"]


def test_the_collector_owns_the_round_staleness_bound_from_the_training_spec() -> None:
    spec = NodeSpec.build(
        swarm=SWARM, ledger_enabled=False, defence_active=False, max_staleness_rounds=1
    )
    collector = build_collector(
        spec,
        MemoryBroker().connect(SWARM),
        NodeDefences.build(spec, CPU_PRESET),
        own_address=ME.address,
    )
    assert collector.ingest(_wire(make_group(PEER, index=1, producer_round=5))) is not None
    assert collector.ingest(_wire(make_group(PEER, index=2, producer_round=4))) is not None
    assert collector.ingest(_wire(make_group(PEER, index=3, producer_round=3))) is None
    assert collector.statistics().rejected == {"stale_round": 1}
    # A newer round evicts what falls behind by the same bound: the sampler sees only fresh.
    assert collector.ingest(_wire(make_group(PEER, index=4, producer_round=6))) is not None
    assert sorted(b.group.producer_round for b in collector.candidates()) == [5, 6]


def test_docs_security_lists_exactly_the_reason_labels() -> None:
    text = (DOCS / "security.md").read_text()
    table = text[text.index("<!-- reasons:start -->") : text.index("<!-- reasons:end -->")]
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE)
    assert sorted(listed) == sorted(r.value for r in RejectReason)
    assert len(listed) == len(set(listed))


class _BrokenCounter(ProducerRoundCap):
    def admitted(self, arrival: Arrival) -> None:
        raise KeyError("a bug in a counter")


def test_a_counter_that_crashes_leaves_the_message_under_one_reason_not_admitted() -> None:
    collector = Collector(
        MemoryBroker().connect(SWARM), own_address=ME.address, checks=[_BrokenCounter(5)]
    )
    assert collector.ingest(_wire(make_group(PEER))) is None
    stats = collector.statistics()
    assert stats.rejected == {"internal_error": 1}
    assert (stats.accepted, stats.buffered) == (0, 0)


@pytest.mark.parametrize(
    ("settings", "share"),
    [
        ({}, 0.5),  # on at 0.5 by default (docs/security.md says why)
        ({"stock_lead_share": 0.25}, 0.25),
        ({"stock_lead_share": 0.5, "defence_active": False}, None),
        ({"stock_lead_share": 0}, None),
    ],
)
def test_a_node_keeps_a_lead_record_while_its_defences_and_its_share_are_on(
    settings: dict[str, object], share: float | None
) -> None:
    spec = NodeSpec.build(swarm=SWARM, ledger_enabled=False, **settings)
    kept = NodeDefences.build(spec, CPU_PRESET).leads
    assert (kept.share if kept is not None else None) == share


def test_the_admission_page_lists_the_rounds_stages_in_the_order_the_judge_runs_them() -> None:
    import inspect

    from sapo_async.node import judge

    text = (DOCS / "admission.md").read_text()
    block = text[text.index("<!-- stages:start -->") : text.index("<!-- stages:end -->")]
    listed = re.findall(r"^\d+\. `([a-z_]+)`", block, flags=re.MULTILINE)
    assert listed == list(judge.STAGES)
    # ... and STAGES is the order the judge's own stage lists run, nothing left out.
    j = judge.Judge(learner=None, limits=None)  # type: ignore[arg-type]
    run = [*j.before_draw(), *j.in_draw()]
    names = [m.__name__.removesuffix("_stage") for m in run]
    assert names == list(judge.STAGES)
    assert all(inspect.ismethod(m) for m in run)
