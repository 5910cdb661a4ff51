"""The stock-lead record (``[defence] stock_lead_share``, off by default): a producer that
shows the same words before its right answers on question after question (the ``filler``
attack: ``The answer is``, what passes the brevity guard) gets those completions left out,
while an honest peer whose work differs by question, or that words one question's work
the same twice, is trained as before (issue 23)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from sapo_async.errors import RejectedInput
from sapo_async.fabric.collector import BufferedGroup
from sapo_async.node.defence import Thresholds
from sapo_async.node.judge import Hold
from sapo_async.node.leads import MIN_ANSWERS, WINDOW_GROUPS, LeadObservation, LeadRecord
from sapo_async.policy.grpo.batch import ScoredCompletion, ScoredGroup, TokenSource
from sapo_async.tasks.reward import lead_key
from tests.fixtures import selection as fx


def _group(producer: str, question: int, leads: tuple[str, str]) -> ScoredGroup:
    """Two right answers (behind ``leads``) and two bare wrong ones, to question ``n``."""
    right, wrong = f" <answer>{question}</answer>", " <answer>-1</answer>"
    texts = (f" {leads[0]}{right}", wrong, f" {leads[1]}{right}", wrong)
    return ScoredGroup(
        prompt=f"What is {question} + 0?",
        completions=tuple(ScoredCompletion(t, float(right in t), "stop") for t in texts),
        tokenizer_id="theirs",
        producer=producer,
        token_source=TokenSource.TEXT,
    )


FILLER = ("The answer is", "the answer is:")
"""The filler attack's lead (the record compares :func:`lead_key`: case and ':' aside)."""


def _honest(n: int) -> tuple[str, str]:
    return (f"{n} + 0 = {n}.", f"Adding 0 to {n} leaves {n}.")


def _pool(groups: list[ScoredGroup]) -> tuple[tuple[BufferedGroup, ...], Any]:
    """``groups`` as buffered candidates, and a learner that scores each as given."""
    fresh, scored = [], {}
    for n, group in enumerate(groups):
        digest = n.to_bytes(32, "big")
        wire = SimpleNamespace(producer=group.producer, completions=(), digest=digest)
        fresh.append(BufferedGroup(wire, digest, 0.0))  # type: ignore[arg-type]
        scored[digest] = group
    return tuple(fresh), fx.fake_learner(lambda g: scored[g.digest])


def _rounds(
    groups: list[ScoredGroup], record: LeadRecord | None, rounds: int = 40
) -> tuple[list[Counter[str]], list[Any], list[str]]:
    """Rounds of J = 1 from the same pool, the record kept as a node keeps it (a copy to
    the selection, the observations back): who was chosen each round, what was trained,
    and the producers the record flagged."""
    fresh, learner = _pool(groups)
    chosen: list[Counter[str]] = []
    trained: list[Any] = []
    flagged: list[str] = []
    for round_ in range(rounds):
        copy = record.copy() if record is not None else None
        choice = fx.select_one(learner, fresh, round_, leads=copy)
        if record is not None:
            flagged += record.observe(choice.leads)
        chosen.append(Counter(c.producer for c in choice.external))
        trained.extend(c.scored for c in choice.external)
    return chosen, trained, flagged


ATTACKED = [_group("attacker", n, FILLER) for n in range(6)] + [
    _group("honest", n, _honest(n)) for n in range(3)
]


def test_lead_key_reads_the_words_before_the_answer_case_spacing_and_colon_aside() -> None:
    assert lead_key(" The  answer is: <answer>5</answer>") == "the answer is"
    assert lead_key("<answer>5</answer>") == ""
    assert lead_key("2 + 3 = 5. <answer>5</answer> more") == "2 + 3 = 5"


def test_without_the_record_a_filler_attacker_keeps_its_slots() -> None:
    chosen, _, _ = _rounds(ATTACKED, None)
    late = sum(chosen[10:], Counter())
    assert late["attacker"] > late["honest"]


def test_the_record_leaves_out_a_filler_attacker_and_keeps_an_honest_peer() -> None:
    chosen, trained, flagged = _rounds(ATTACKED, LeadRecord(0.5))
    assert flagged == ["attacker"]
    late = sum(chosen[10:], Counter())
    assert late == {"honest": 30}
    # The honest peer's groups are trained whole: its work differs by question.
    assert all(len(g.completions) == 4 for g in trained if g.producer == "honest")


def test_the_completions_the_record_leaves_out_are_counted_as_stock_lead() -> None:
    fresh, learner = _pool(ATTACKED)
    record, left_out = LeadRecord(0.5), Counter[str]()
    for round_ in range(40):
        choice = fx.select_one(learner, fresh, round_, leads=record.copy())
        record.observe(choice.leads)
        assert set(choice.left_out) <= {"attacker"}  # the honest peer loses nothing
        left_out.update(choice.left_out.get("attacker", {}))
    # Both filler answers of every attacker group scored once the lead was read.
    assert set(left_out) == {"stock_lead"}
    assert left_out["stock_lead"] >= 2 * 10
    assert left_out["stock_lead"] % 2 == 0


def test_a_flagged_producers_oversize_completion_is_refused_not_just_left_out() -> None:
    # The record leaves out a flagged attacker's filler; the size bound still reads it, so
    # a filler too long to send is refused (and counts toward quarantine) as before the
    # record, not dropped as uninformative where nothing counts it.
    groups = [_group("attacker", n, FILLER) for n in range(6)]
    first, *rest = groups[5].completions  # the filler, then 40 words after the answer
    long = dataclasses.replace(first, text=first.text + " so" * 40)
    groups[5] = dataclasses.replace(groups[5], completions=(long, *rest))
    fresh, learner = _pool(groups)
    record = LeadRecord(0.5)
    for round_ in range(30):  # until the record has flagged the attacker
        record.observe(fx.select_one(learner, fresh[:5], round_, leads=record.copy()).leads)
    assert record.stock("attacker") == "the answer is"
    limits = Thresholds(families={}, max_tokens=64, plausibility=False, length_guard=False)
    choice = fx.select_one(learner, fresh[5:], 0, leads=record.copy(), limits=limits)
    assert [v.reason for v in choice.drops] == ["completion_too_many_tokens"]
    choice = fx.select_one(learner, fresh[:1], 0, leads=record.copy(), limits=limits)
    assert choice.drops == []
    assert choice.selection.dropped_uninformative == 1  # left out, nothing to refuse


def test_one_question_worded_the_same_every_time_is_not_a_stock_lead() -> None:
    # An honest peer that says "3 + 0 = 3." to the same question again and again is
    # showing work, not filler: a lead must recur on MIN_QUESTIONS different questions.
    same = [_group("steady", 3, ("3 + 0 = 3.", "3 + 0 = 3.")) for _ in range(8)]
    _, trained, flagged = _rounds(same, LeadRecord(0.5), rounds=20)
    assert flagged == []
    assert len(trained) == 20
    assert all(len(g.completions) == 4 for g in trained)


def test_the_share_needs_enough_answers_and_reads_the_newest_groups_each_once() -> None:
    def seen(n: int, leads: tuple[str, ...], question: int | None = None) -> LeadObservation:
        q = f"q{n if question is None else question}"
        return LeadObservation(bytes([n]) * 32, "p", q, leads)

    record = LeadRecord(0.5)
    stock = [seen(n, ("the answer is",) * 2) for n in range(MIN_ANSWERS // 2)]
    assert record.observe(stock[:-1]) == []  # 6 answers: too few to judge
    assert record.observe(stock[-2:]) == ["p"]  # the repeat counts once
    assert record.stock("p") == "the answer is"
    assert record.observe(stock) == []  # already flagged: not reported again
    worked = [seen(100 + n, (f"{n} + 1 = {n + 1}", "")) for n in range(WINDOW_GROUPS)]
    record.observe(worked[:4])  # 8 of 16 answers: the share is reached
    assert record.stock("p") == "the answer is"
    record.observe(worked[4:5])  # 8 of 18
    assert record.stock("p") is None
    assert record.stock("someone else") is None
    # Only the newest WINDOW_GROUPS count; empty leads (bare answers) are never a stock
    # lead (the brevity guard's case), though they count among the answers.
    record.observe(worked)
    bare = [seen(200 + n, ("", "")) for n in range(WINDOW_GROUPS)]
    assert record.observe(bare) == []
    # The same words on fewer than MIN_QUESTIONS questions: not stock.
    two = [seen(220 + n, ("so",) * 2, question=n % 2) for n in range(WINDOW_GROUPS)]
    assert record.observe(two) == []


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="stock_lead_share"):
        LeadRecord(share)


def test_with_probation_a_filler_attacker_is_judged_before_any_of_its_groups_is_trained() -> None:
    # On SmolLM2 the record alone came too late: the draw trained a few of each attacker's
    # groups before it had scored enough of them to read the share (docs/security.md).
    chosen, _, _ = _rounds(ATTACKED, LeadRecord(0.5), rounds=20)
    assert sum(chosen, Counter())["attacker"] > 0
    chosen, trained, flagged = _rounds(ATTACKED, LeadRecord(0.5, probation=True), rounds=20)
    assert flagged == ["attacker"]
    assert sum(chosen, Counter()) == {"honest": 20}
    assert all(len(g.completions) == 4 for g in trained)


def test_on_probation_a_producers_groups_wait_in_the_buffer_until_it_can_be_judged() -> None:
    fresh, learner = _pool([_group("filler", n, FILLER) for n in range(4)])
    record = LeadRecord(0.5, probation=True)
    # Two groups: the same words before answers to 2 questions, 4 answers, too few to read
    # the share: scored for the record, held (not dropped, not trained).
    first = fx.select_one(learner, fresh[:2], 0, leads=record.copy())
    assert (first.external, first.drops, first.held) == ([], [], {Hold.PROBATION: 2})
    record.observe(first.leads)
    assert record.unproven("filler")
    # Two more: 8 answers on 4 questions: the share is read (a stock lead), so the groups
    # are judged, their filler left out (nothing left with a spread to train).
    second = fx.select_one(learner, fresh, 1, leads=record.copy())
    record.observe(second.leads)
    assert not record.unproven("filler")
    assert record.stock("filler") == lead_key(f"{FILLER[0]} <answer>1</answer>")
    assert (second.external, second.held) == ([], {})
    assert not LeadRecord(0.5).unproven("anyone")  # probation off: nothing waits


def test_on_probation_a_peer_with_no_repeated_words_is_trained_from_its_first_group() -> None:
    # Issue 57: probation held every producer until answers on three questions, which at
    # SmolLM2's reward rate cost an honest peer several rounds of sharing. A producer whose
    # words differ by question is not held: nothing about it is for the record to judge.
    fresh, learner = _pool([_group("honest", n, _honest(n)) for n in range(2)])
    record = LeadRecord(0.5, probation=True)
    first = fx.select_one(learner, fresh, 0, leads=record.copy())
    assert (len(first.external), first.held) == (1, {})
    record.observe(first.leads)
    assert not record.unproven("honest")


def test_a_producer_waits_only_once_its_words_repeat_on_two_questions_then_for_eight() -> None:
    def seen(n: int, leads: tuple[str, ...]) -> LeadObservation:
        return LeadObservation(bytes([n]) * 32, "p", f"q{n}", leads)

    varied = LeadRecord(0.5, probation=True)
    assert not varied.unproven("p")  # nothing seen: nothing to judge
    varied.observe([seen(n, (f"{n} + 1 = {n + 1}", "")) for n in range(3)])
    assert not varied.unproven("p")  # nothing repeated across questions
    repeated = LeadRecord(0.5, probation=True)
    repeated.observe([seen(0, ("so", "so"))])
    assert not repeated.unproven("p")  # one question worded the same twice: not evidence
    # One phrase on two questions, beside varied work: it might be stock, so the record
    # waits for the eight answers that let it read the share.
    repeated.observe([seen(n, ("so", f"{n} + 1 = {n + 1}")) for n in range(1, 3)])
    assert repeated.unproven("p")
    repeated.observe([seen(3, ("so",))])
    assert repeated.unproven("p")  # 7 answers
    repeated.observe([seen(4, ("4 + 1 = 5",))])
    assert not repeated.unproven("p")
    assert repeated.stock("p") == "so"  # 5 of the 8: over the share, and judged stock


def test_on_probation_a_held_group_is_scored_once_and_one_that_fails_scoring_is_dropped() -> None:
    fresh, learner = _pool([_group("new", n, FILLER) for n in (0, 1, 2)])
    calls: Counter[bytes] = Counter()
    score = learner.score_external

    def counted(group: Any) -> Any:
        calls[group.digest] += 1
        if group.digest == fresh[2].rollout_hash:
            raise RejectedInput("task_mismatch", "claims an answer its task does not have")
        return score(group)

    learner.score_external = counted
    record = LeadRecord(0.5, probation=True)
    for round_ in range(3):
        choice = fx.select_one(learner, fresh[:2] if round_ else fresh, round_, leads=record.copy())
        record.observe(choice.leads)
        assert choice.external == []
        assert choice.held == {Hold.PROBATION: 2}  # the two that scored (two questions) wait
        if round_ == 0:  # the one that failed reached the draw: dropped with its reason
            assert [v.reason for v in choice.drops] == ["task_mismatch"]
    assert calls == {fresh[0].rollout_hash: 1, fresh[1].rollout_hash: 1, fresh[2].rollout_hash: 2}
