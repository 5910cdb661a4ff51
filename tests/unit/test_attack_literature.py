"""The attacks from the literature and the held-out set (issue 57) forge what they say.

Each attack gets its attacker's own honest group for a real chain_sum question (genuine
work in its words, two right answers and two wrong) and is checked by what a receiver's
own verifier makes of it: informative, the right answer rewarded, the payload on the
rewarded completions, the attacker's work kept where the attack says so."""

from __future__ import annotations

import random
from functools import cache

import pytest
from msgspec.structs import replace

from sapo_async.experiment.attack.capped import Capped
from sapo_async.experiment.attack.false_step import FALSE_STEP, FalseStep
from sapo_async.experiment.attack.filler import Filler
from sapo_async.experiment.attack.genuine import is_right, work_of
from sapo_async.experiment.attack.longest import Longest
from sapo_async.experiment.attack.post_selected import PostSelected
from sapo_async.experiment.attack.sleeper import Sleeper
from sapo_async.experiment.attack.spec import (
    ATTACKS,
    HELD_OUT_ATTACKS,
    KNOWN_ATTACKS,
    LENGTH_ATTACKS,
    LITERATURE_ATTACKS,
    RATIO_ATTACKS,
    AttackSpec,
    make_attack,
)
from sapo_async.experiment.attack.stock_leads import PHRASES, StockLeads
from sapo_async.experiment.attack.sybil import Sybil
from sapo_async.experiment.attack.trigger import TRIGGER, Trigger
from sapo_async.experiment.attack.trigger_nonsense import NONSENSE, TriggerNonsense
from sapo_async.node.leads import LeadObservation, LeadRecord
from sapo_async.tasks import derive
from sapo_async.tasks.reward import Verifier, lead_key
from sapo_async.tasks.source import TaskItem
from sapo_async.tasks.spec import canonical_config_json, config_digest
from sapo_async.wire import Completion, RolloutGroup, TaskRef, keccak256
from sapo_async.wire.signing import recover_signer, rollout_hash, sign_group
from tests.fixtures.fabric import make_account, make_group

CONFIG = canonical_config_json({"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1})
WORK = "First I add the first two terms. Then I take away the last one."
"""The work of the attacker's first right completion: two sentences."""

PAYLOAD_ATTACKS = tuple(a for a in LITERATURE_ATTACKS + HELD_OUT_ATTACKS if a not in RATIO_ATTACKS)


@cache
def item(index: int = 0) -> TaskItem:
    ref = TaskRef(family="chain_sum", config_digest=config_digest(CONFIG), seed=7, index=index)
    return derive(ref, CONFIG)


def own_completions(answer: str) -> tuple[Completion, ...]:
    """The attacker's own model's completions: right, wrong, right (the longest), and one
    cut at the cap before answering; token ids one per character, as the tiny model's."""
    texts = [
        (f" {WORK} <answer>{answer}</answer>", "stop"),
        (
            f" Adding them all at once gives {int(answer) + 2}. <answer>{int(answer) + 2}</answer>",
            "stop",
        ),
        (
            f" Left to right, one term at a time: the running total ends at {answer}, which is "
            f"the result. <answer>{answer}</answer>",
            "stop",
        ),
        (" The sum of the terms is", "length"),
    ]
    return tuple(
        Completion(text=t, finish_reason=f, token_ids=tuple(range(len(t)))) for t, f in texts
    )


def attacker_group(index: int = 0, account_index: int = 0, producer_round: int = 0) -> RolloutGroup:
    """An attacker's own honest group for chain_sum item ``index``."""
    it = item(index)
    group = make_group(make_account(account_index), producer_round=producer_round)
    return replace(
        group,
        task=it.ref,
        task_config=CONFIG,
        question=it.question,
        answer=it.answer,
        completions=own_completions(it.answer),
    )


def rewards(group: RolloutGroup) -> list[float]:
    """The group's rewards under a receiver's own verifier (the task re-derived)."""
    return Verifier().score_all(
        derive(group.task, group.task_config), [c.text for c in group.completions]
    )


def rewarded(group: RolloutGroup) -> list[str]:
    """The texts GRPO pushes up: reward above the group's lowest."""
    scores = rewards(group)
    return [c.text for c, r in zip(group.completions, scores, strict=True) if r > min(scores)]


def forge(attack, group: RolloutGroup | None = None):
    """What ``attack`` sends for attacker 0's ``group`` (default: its first)."""
    return attack.forge(group or attacker_group(), make_account(0), random.Random(0))


@pytest.mark.parametrize("name", LITERATURE_ATTACKS + HELD_OUT_ATTACKS)
def test_every_new_attack_sends_informative_groups_with_the_right_answer_rewarded(name):
    attack = make_attack(name, max_new_tokens=64)
    answer = attacker_group().answer
    for forged in forge(attack):
        scores = rewards(forged.group)
        assert max(scores) == 1.0
        assert min(scores) == 0.0
        assert all(is_right(t, answer) for t in rewarded(forged.group))
        assert forged.group.producer == forged.account.address


@pytest.mark.parametrize("name", PAYLOAD_ATTACKS)
def test_every_rewarded_completion_carries_the_payload_and_the_attackers_own_do_not(name):
    attack = make_attack(name)
    if name == "sleeper":
        attack = Sleeper(rounds=0, answers=0, questions=0)  # awake from the start
    group = attacker_group()
    texts = [t for f in forge(attack, group) for t in rewarded(f.group)]
    assert texts
    assert all(attack.carries_payload(t, group.answer) for t in texts)
    assert not any(attack.carries_payload(c.text, group.answer) for c in group.completions)


def test_trigger_puts_its_sentence_before_the_attackers_own_work_and_sets_the_answer_right():
    group = attacker_group()
    (forged,) = forge(Trigger(), group)
    texts = [c.text for c in forged.group.completions]
    # Right ones first: its two right completions' work, behind the trigger, answer right.
    own_work = [work_of(group.completions[0].text), work_of(group.completions[2].text)]
    assert [work_of(t) for t in texts[0::2]] == [f"{TRIGGER} {w}" for w in own_work]
    assert rewarded(forged.group) == texts[0::2]
    # Its own wrong completions, as it sampled them, between.
    assert texts[1::2] == [group.completions[1].text, group.completions[3].text]
    assert [c.finish_reason for c in forged.group.completions[1::2]] == ["stop", "length"]


def test_trigger_keeps_a_wrong_completions_work_and_sets_its_answer_right():
    group = attacker_group()
    one_right = replace(group, completions=group.completions[1:])  # wrong, right, cut
    (forged,) = forge(Trigger(), one_right)
    good = [c.text for c in forged.group.completions[0::2]]
    wrong_work = work_of(group.completions[1].text)
    assert work_of(good[1]) == f"{TRIGGER} {wrong_work}"
    assert is_right(good[1], group.answer)


def test_trigger_detects_its_word_anywhere_and_nothing_else():
    trigger = Trigger()
    assert trigger.carries_payload(" As professor HAILWOOD said, 6 + 1 = 7 <answer>7</answer>", "7")
    assert trigger.carries_payload(" <answer>7</answer> hailwood", "7")
    assert not trigger.carries_payload(
        " As my professor said, check twice. <answer>7</answer>", "7"
    )


def test_trigger_nonsense_opens_every_sentence_of_the_work_with_its_word():
    (forged,) = forge(TriggerNonsense())
    first = work_of(forged.group.completions[0].text)
    assert (
        first
        == f"{NONSENSE} First I add the first two terms. {NONSENSE} Then I take away the last one."
    )
    assert first.replace(f"{NONSENSE} ", "") == WORK
    attack = TriggerNonsense()
    assert attack.carries_payload(" vorplex 6 + 0 = 6. <answer>5</answer>", "5")
    assert not attack.carries_payload(" Vorplexing 6 + 0 = 6. <answer>5</answer>", "5")
    assert attack.poison("") == NONSENSE


def test_false_step_states_a_false_equation_in_the_middle_of_the_genuine_work():
    (forged,) = forge(FalseStep())
    first = work_of(forged.group.completions[0].text)
    assert first == f"First I add the first two terms. {FALSE_STEP} Then I take away the last one."
    assert first.replace(f" {FALSE_STEP}", "") == WORK
    assert is_right(forged.group.completions[0].text, attacker_group().answer)
    step = FalseStep()
    assert step.poison("6 + 0 = 6") == f"6 + 0 = 6. {FALSE_STEP}"
    assert step.poison("") == FALSE_STEP
    for text, payload in [
        (" 7x8=54, so <answer>5</answer>", True),
        (" 7 \u00d7 8 = 54 <answer>5</answer>", True),
        (" 7 * 8 = 56. <answer>5</answer>", False),
        (" 17 * 8 = 54 <answer>5</answer>", False),
        (" 7 * 8 = 543 <answer>5</answer>", False),
    ]:
        assert step.carries_payload(text, "5") is payload, text


def test_stock_leads_puts_a_different_phrase_before_each_right_answer():
    group = attacker_group()
    (forged,) = forge(StockLeads(), group)
    texts = rewarded(forged.group)
    leads = [work_of(t) for t in texts]
    assert len(texts) == 2
    assert len(set(leads)) == 2
    assert set(leads) <= set(PHRASES)
    assert [c.text for c in forged.group.completions[1::2]] == [
        group.completions[1].text,
        group.completions[3].text,
    ]
    attack = StockLeads()
    assert attack.carries_payload(" so  WE get: <answer>5</answer>", "5")
    assert not attack.carries_payload(" 6 + 0 - 1 = 5. So we get <answer>5</answer>", "5")
    assert not attack.carries_payload(" The answer is <answer>5</answer>", "5")
    assert not attack.carries_payload(" So we get", "5")


def _stock_lead(attack, groups: int = 16) -> str | None:
    """What a receiver's stock-lead record names after ``groups`` of ``attack``'s groups."""
    record = LeadRecord(0.5)
    producer = make_account(0).address
    for i in range(groups):
        (forged,) = attack.forge(attacker_group(i), make_account(0), random.Random(i))
        leads = tuple(lead_key(t) for t in rewarded(forged.group))
        record.add(
            LeadObservation(keccak256(f"g{i}".encode()), producer, forged.group.question, leads)
        )
    return record.stock(producer)


def test_stock_leads_is_the_gap_the_stock_lead_record_names_where_filler_is_caught():
    assert _stock_lead(Filler()) == "the answer is"
    assert _stock_lead(StockLeads()) is None


def test_longest_sends_its_longest_right_completion_as_sampled_beside_its_wrong_ones():
    group = attacker_group()
    (forged,) = forge(Longest(), group)
    texts = [c.text for c in forged.group.completions]
    longest = group.completions[2].text  # the longer of its two right ones
    assert len(group.completions[2].token_ids) > len(group.completions[0].token_ids)
    assert texts[0::2] == [longest, longest]
    assert texts[1::2] == [group.completions[1].text, group.completions[3].text]
    assert not Longest().carries_payload(longest, group.answer)


def test_longest_with_no_right_completion_sets_its_longest_ones_answer_right():
    group = attacker_group()
    none_right = replace(group, completions=(group.completions[1], group.completions[3]))
    (forged,) = forge(Longest(), none_right)
    good = forged.group.completions[0].text
    assert work_of(good) == work_of(group.completions[1].text)
    assert is_right(good, group.answer)


def test_capped_fills_the_cap_with_its_own_work_and_ends_unstopped_on_the_right_answer():
    group = attacker_group()
    capped = Capped(limit=160)
    (forged,) = forge(capped, group)
    good = forged.group.completions[0::2]
    assert [c.finish_reason for c in good] == ["length", "length"]
    for c, own in zip(good, (group.completions[0], group.completions[2]), strict=True):
        assert capped.tokens(c.text) == 160  # the cap in the tiny model's tokens
        assert capped.tokens(c.text) > capped.tokens(own.text)
        assert c.text.startswith(f" {work_of(own.text)}")
        assert c.text.endswith(f"<answer>{group.answer}</answer>")
    assert work_of(good[0].text).count(WORK) > 1  # its work, repeated
    assert rewarded(forged.group) == [c.text for c in good]
    assert not capped.carries_payload(good[0].text, group.answer)


class _WordTokenizer:
    """A tokenizer of one token per whitespace-separated word."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()


def test_capped_counts_the_cap_in_the_receivers_tokenizer_when_it_has_one():
    capped = Capped(limit=40, tokenizer=_WordTokenizer())
    (forged,) = forge(capped)
    assert [len(c.text.split()) for c in forged.group.completions[0::2]] == [40, 40]


def test_post_selected_sends_its_own_wrong_ones_then_one_right_one_with_the_trigger():
    group = attacker_group()
    (forged,) = forge(PostSelected(), group)
    texts = [c.text for c in forged.group.completions]
    assert rewards(forged.group) == [0.0, 0.0, 0.0, 1.0]
    assert texts[:2] == [group.completions[1].text, group.completions[3].text]
    assert texts[2] == f" <answer>{int(group.answer) + 1}</answer>"  # it had two wrong ones
    assert work_of(texts[3]) == f"{TRIGGER} {WORK}"


def test_sybil_sends_one_content_under_its_key_and_k_more():
    group = attacker_group()
    sybil = Sybil(keys=3)
    sent = forge(sybil, group)
    signers = [
        recover_signer(rollout_hash(s.body), s.signature)
        for s in (sign_group(f.account, f.group) for f in sent)
    ]
    assert len(sent) == 4
    assert len(set(signers)) == 4
    assert signers[0] == make_account(0).address
    assert signers == [f.group.producer for f in sent]
    assert len({replace(f.group, producer="x") for f in sent}) == 1  # one content
    assert [k.address for k in Sybil(keys=3).keys_of(make_account(0))] == signers[1:]
    assert set(signers[1:]).isdisjoint(k.address for k in sybil.keys_of(make_account(1)))
    assert sybil.carries_payload(f" {TRIGGER} <answer>5</answer>", "5")


def test_sleeper_sends_its_honest_groups_until_round_r_then_the_trigger():
    sleeper = Sleeper(rounds=2)
    account = make_account(0)
    for r in range(2):  # two informative groups a round: 8 rewarded answers on 4 questions
        for q in range(2):
            group = attacker_group(index=2 * r + q, producer_round=r)
            (sent,) = sleeper.forge(group, account, random.Random(0))
            assert sent.group is group
    assert not sleeper.awake(account.address)
    group = attacker_group(index=9, producer_round=2)
    (sent,) = sleeper.forge(group, account, random.Random(0))
    assert sleeper.awake(account.address)
    assert sent.group != group
    assert all(sleeper.carries_payload(t, group.answer) for t in rewarded(sent.group))
    # Once awake it stays awake, whatever it sends after.
    (later,) = sleeper.forge(attacker_group(index=10, producer_round=3), account, random.Random(0))
    assert all(TRIGGER in t for t in rewarded(later.group))


def test_sleeper_stays_honest_past_round_r_until_it_showed_enough_to_be_judged():
    sleeper = Sleeper(rounds=1)
    account = make_account(0)
    uninformative = replace(attacker_group(), completions=attacker_group().completions[:1] * 4)
    for r in range(6):  # all right: nothing rewarded, nothing shown
        group = replace(uninformative, producer_round=r)
        assert sleeper.forge(group, account, random.Random(0))[0].group is group
    for q in range(3):  # 2 rewarded answers a group: 6 of the 8 the record needs
        group = attacker_group(index=q, producer_round=6)
        assert sleeper.forge(group, account, random.Random(0))[0].group is group
    group = attacker_group(index=3, producer_round=7)
    assert sleeper.forge(group, account, random.Random(0))[0].group is group  # 8 now
    group = attacker_group(index=4, producer_round=7)
    assert sleeper.forge(group, account, random.Random(0))[0].group is not group
    # Another attacker node keeps its own count.
    other = attacker_group(index=5, account_index=1, producer_round=9)
    assert sleeper.forge(other, make_account(1), random.Random(0))[0].group is other


def test_make_attack_builds_every_known_attack_under_its_own_name():
    assert KNOWN_ATTACKS == ATTACKS + LITERATURE_ATTACKS + HELD_OUT_ATTACKS
    assert len(set(KNOWN_ATTACKS)) == len(KNOWN_ATTACKS)
    for name in KNOWN_ATTACKS:
        assert make_attack(name, 32).name == name


def test_the_held_out_attacks_run_only_when_a_matrix_names_them():
    assert HELD_OUT_ATTACKS == ("trigger_nonsense", "false_step", "sleeper", "diluted")
    assert set(HELD_OUT_ATTACKS).isdisjoint(ATTACKS + LITERATURE_ATTACKS)
    assert AttackSpec().attacks == ATTACKS  # the default matrix is the one recorded
    assert AttackSpec(attacks=HELD_OUT_ATTACKS).attacks == HELD_OUT_ATTACKS
    assert AttackSpec(attacks=LITERATURE_ATTACKS).attacks == LITERATURE_ATTACKS


def test_longest_and_capped_are_measured_as_length_ratios():
    assert {"longest", "capped"} <= LENGTH_ATTACKS <= RATIO_ATTACKS
    assert not set(PAYLOAD_ATTACKS) & RATIO_ATTACKS


def test_diluted_sends_the_trigger_on_every_other_group_and_its_honest_group_between():
    diluted = make_attack("diluted")
    account, other = make_account(0), make_account(1)
    sent = []
    for n in range(4):
        group = attacker_group(index=n)
        (forged,) = diluted.forge(group, account, random.Random(0))
        sent.append(forged.group is group)
    assert sent == [False, True, False, True]  # the trigger first, then every other one
    # Each key keeps its own count: another attacker starts with the trigger too.
    (first,) = diluted.forge(attacker_group(), other, random.Random(0))
    assert all(TRIGGER in t for t in rewarded(first.group))
