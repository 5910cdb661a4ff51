"""Task derivation, the seeding scheme, prompts and the verifier, with real reasoning-gym."""

from __future__ import annotations

import time

import msgspec
import pytest
import reasoning_gym
from hypothesis import given
from hypothesis import strategies as st

from sapo_async.errors import ConfigError, RejectedInput
from sapo_async.tasks import (
    CPU_PRESET,
    PAPER_PRESET,
    FamilySpec,
    TaskSource,
    Verifier,
    canonical_config_json,
    config_digest,
    dataset_seed,
    derive,
    extract_answer,
    format_prompt,
    format_target,
    item_index,
    preset,
)
from sapo_async.wire import TaskRef

CHAIN = CPU_PRESET[0]


def test_canonical_config_json_is_sorted_compact_and_key_order_free() -> None:
    a = canonical_config_json({"b": 1, "a": (1, 2)})
    assert a == '{"a":[1,2],"b":1}'
    assert a == canonical_config_json({"a": [1, 2], "b": 1})
    assert config_digest(a).startswith("0x")
    assert len(config_digest(a)) == 66


def test_config_with_seed_is_rejected() -> None:
    with pytest.raises(ConfigError, match="seed"):
        canonical_config_json({"seed": 3})


def test_derive_reproduces_reasoning_gyms_item() -> None:
    ref = TaskRef(family="chain_sum", config_digest=CHAIN.digest, seed=7, index=12345)
    item = derive(ref, CHAIN.config_json)
    direct = reasoning_gym.create_dataset("chain_sum", seed=7, size=1, **dict(CHAIN.config))[12345]
    assert (item.question, item.answer) == (direct["question"], direct["answer"])
    assert derive(ref, CHAIN.config_json) == item


def test_derive_rejects_a_config_that_does_not_match_the_digest() -> None:
    ref = TaskRef(family="chain_sum", config_digest=CHAIN.digest, seed=0, index=0)
    other = canonical_config_json({**CHAIN.config, "max_terms": 5})
    with pytest.raises(RejectedInput) as info:
        derive(ref, other)
    assert info.value.reason == "task_config_digest"


def test_derive_rejects_an_unknown_family() -> None:
    cfg = canonical_config_json({})
    ref = TaskRef(family="no_such_family", config_digest=config_digest(cfg), seed=0, index=0)
    with pytest.raises(RejectedInput) as info:
        derive(ref, cfg)
    assert info.value.reason == "task_family"


def test_derive_rejects_a_config_reasoning_gym_refuses() -> None:
    cfg = canonical_config_json({"min_terms": 5, "max_terms": 2})
    ref = TaskRef(family="chain_sum", config_digest=config_digest(cfg), seed=0, index=0)
    with pytest.raises(RejectedInput) as info:
        derive(ref, cfg)
    assert info.value.reason == "task_derivation"


def test_reasoning_gym_overlaps_neighbouring_seeds_which_the_layout_avoids() -> None:
    # The pitfall the layout exists for: (seed s, idx i + 1) is (seed s + 1, idx i).
    ds0 = reasoning_gym.create_dataset("chain_sum", seed=0, size=1, **dict(CHAIN.config))
    ds1 = reasoning_gym.create_dataset("chain_sum", seed=1, size=1, **dict(CHAIN.config))
    assert ds0[5]["question"] == ds1[4]["question"]
    # Our seed+index keys are distinct across purposes, nodes, rounds and slots.
    keys = {
        dataset_seed(s) + item_index(p, n, r, k)
        for s in (0, 1)
        for p in ("train", "eval", "warmstart")
        for n in (0, 1, 7)
        for r in (0, 1, 2)
        for k in (0, 1, 1023)
    }
    assert len(keys) == 2 * 3 * 3 * 3 * 3


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("train", 1 << 20, 0, 0), "node"),
        (("train", 0, -1, 0), "round"),
        (("x", 0, 0, 0), "purpose"),
    ],
)
def test_item_index_rejects_out_of_range_fields(args: tuple, name: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=name):
        item_index(*args)


def test_round_items_are_a_pure_function_and_differ_between_nodes_and_purposes() -> None:
    a = TaskSource(CPU_PRESET, swarm_seed=3)
    b = TaskSource(CPU_PRESET, swarm_seed=3)
    assert a.round_items(2, 5, 8) == b.round_items(2, 5, 8)
    refs = {it.ref for it in a.round_items(2, 5, 8)}
    refs |= {it.ref for it in a.round_items(3, 5, 8)}
    refs |= {it.ref for it in a.round_items(2, 6, 8)}
    refs |= {it.ref for it in a.eval_items(8, node=2)}
    assert len(refs) == 32


def test_paper_preset_derives_every_family_at_a_far_index() -> None:
    source = TaskSource(PAPER_PRESET, swarm_seed=1)
    families = {source.item("train", 999, 1000, s).ref.family for s in range(64)}
    assert families == {f.family for f in PAPER_PRESET}


@pytest.mark.parametrize("name", ["real_mix", "real_sparse"])
def test_real_model_presets_derive_every_family_and_score_its_answer(name: str) -> None:
    families = preset(name)
    source = TaskSource(families, swarm_seed=5)
    items = [source.item("train", 3, 7, s) for s in range(48)]
    assert {it.ref.family for it in items} == {f.family for f in families}
    v = Verifier()
    for it in items:
        assert v.score(it, format_target(it.answer, tagged=True)) == 1.0
        assert v.score(it, format_target(it.answer, tagged=False)) == 0.0


def test_task_source_rejects_unknown_families_and_bad_weights() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        TaskSource([FamilySpec("no_such_family")])
    with pytest.raises(ConfigError, match="weight"):
        TaskSource([FamilySpec("chain_sum", weight=0.0)])
    with pytest.raises(ConfigError, match="preset"):
        preset("gpu")


def test_compact_prompt_is_the_expression_and_instruct_prompt_asks_for_tags() -> None:
    item = TaskSource(CPU_PRESET).round_items(0, 0, 1)[0]
    assert format_prompt(item) == item.metadata["expression"] + " ="
    assert "<answer>" in format_prompt(item, "instruct")
    assert item.question in format_prompt(item, "instruct")
    assert format_target("12", tagged=True) == " <answer>12</answer>"
    assert format_target("12", tagged=False) == " 12"


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (" <answer>12</answer>", "12"),
        ("<answer> 1 </answer> then <answer>7</answer>", "7"),
        ("<answer>a\nb</answer>", "a\nb"),
        (" 12", None),
        ("<answer>12", None),
    ],
)
def test_extract_answer_takes_the_last_tag_pair(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


def test_verifier_uses_the_familys_scorer_and_needs_the_tag() -> None:
    item = TaskSource(CPU_PRESET).round_items(0, 0, 1)[0]
    right = item.answer
    v = Verifier()
    assert v.score(item, f" <answer>{right}</answer>") == 1.0
    assert v.score(item, f" {right}") == 0.0  # bare answers score 0
    assert v.score(item, f"<answer>{right}.0</answer>") == 1.0  # chain_sum: decimal equality
    assert v.score(item, f"<answer>9{right}</answer>") == pytest.approx(
        len(right) / (len(right) + 1)
    )
    assert v.score(item, "<answer></answer>") == 0.0


def test_format_reward_is_off_by_default_and_adds_a_bonus_for_tags() -> None:
    item = TaskSource(CPU_PRESET).round_items(0, 0, 1)[0]
    v = Verifier(format_reward=0.1)
    assert v.score(item, "<answer>xyz</answer>") == pytest.approx(0.1)
    assert v.score(item, "xyz") == 0.0
    with pytest.raises(ConfigError):
        Verifier(format_reward=-1.0)


def test_the_verifier_reads_no_text_after_the_closing_tag() -> None:
    # Where the inject and tokens attacks put their payload: a right answer rewards the
    # payload as much as the answer, which is why a receiver cuts it off (the view).
    import random

    from sapo_async.experiment.attack.inject import Inject
    from sapo_async.experiment.attack.tokens import Tokens
    from sapo_async.tasks.reward import text_after_answer
    from tests.fixtures.fabric import make_account, make_group

    item = TaskSource(CPU_PRESET).round_items(0, 0, 1)[0]
    right = f" <answer>{item.answer}</answer>"
    loose = Verifier()
    assert loose.score(item, right + " \n") == loose.score(item, right) == 1.0
    assert loose.score(item, right + " 3+*(") == 1.0
    assert loose.score(item, "<answer>x</answer>" + right) == 1.0  # the last pair counts
    assert not text_after_answer("no tags at all")
    group = make_group(make_account(0))
    for attack in (Inject(), Tokens()):
        forged = attack.forge(group, make_account(1), random.Random(0))[0].group
        texts = [c.text for c in forged.completions]
        assert any(text_after_answer(t) for t in texts)


def test_the_largest_swarm_seed_fits_the_wire_and_the_next_one_is_refused_by_name() -> None:
    # node.seed 4096 used to build TaskRef.seed = 4096 << 52 >= 2**64, which msgpack cannot
    # encode: the node crashed at round 0 with an OverflowError.
    from sapo_async.limits import MAX_SWARM_SEED
    from sapo_async.node.spec import NodeSpec
    from sapo_async.ops.config import load_config
    from sapo_async.wire import encode_group
    from tests.fixtures.fabric import make_account, make_group

    assert MAX_SWARM_SEED == 4095
    item = TaskSource(CPU_PRESET, swarm_seed=MAX_SWARM_SEED).item(
        "warmstart", (1 << 20) - 1, (1 << 20) - 1, (1 << 10) - 1
    )
    account = make_account(0)
    encode_group(msgspec.structs.replace(make_group(account), task=item.ref))  # no overflow
    with pytest.raises(ConfigError, match=r"0\.\.4095"):
        TaskSource(CPU_PRESET, swarm_seed=4096)
    with pytest.raises(ConfigError) as err:
        NodeSpec.build(seed=4096)
    assert err.value.field == "training.seed"
    with pytest.raises(ConfigError, match=r"training\.seed"):
        load_config(training={"seed": 4096})


_TAG_PIECES = st.sampled_from(["<answer>", "</answer>", "<ans", "wer>", "</", "7", " ", "\n"])


@given(st.lists(_TAG_PIECES, max_size=30).map("".join))
def test_extract_answer_reads_pairs_as_the_non_greedy_regex_does(text: str) -> None:
    import re

    pattern = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    matches = pattern.findall(text)
    assert extract_answer(text) == (matches[-1].strip() if matches else None)


def test_extract_answer_is_linear_in_unclosed_opening_tags() -> None:
    # The regex it replaces took 16 s on 20,000 unclosed tags (quadratic: every opening tag
    # rescanned the rest of the text); 200,000 would take over half an hour. Linear: ms.
    text = "<answer>" * 200_000 + "</answer"
    started = time.perf_counter()
    assert extract_answer(text) is None
    assert time.perf_counter() - started < 10.0  # quadratic: over half an hour
