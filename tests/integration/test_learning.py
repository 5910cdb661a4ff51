"""The learning core end to end on the real tiny model with real reasoning-gym scoring."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from typer.testing import CliRunner

from sapo_async.cli.main import build_app
from sapo_async.errors import CheckpointError, RejectedInput
from sapo_async.node.alone import run_alone
from sapo_async.node.checkpoint import load_checkpoint
from sapo_async.node.groups import to_rollout_group
from sapo_async.node.learner import Learner, LearnerSettings
from sapo_async.policy.generation import Generator
from sapo_async.policy.generation.fake import FakeGenerator
from sapo_async.policy.generation.transformers_backend import TransformersGenerator
from sapo_async.policy.grpo import ScoredCompletion, ScoredGroup, Trainer, TrainerConfig
from sapo_async.policy.grpo.batch import TokenSource
from sapo_async.policy.models import ensure_tiny_model, load_model, read_report, tokenizer_id
from sapo_async.tasks import TaskSource, extract_answer, preset
from sapo_async.wire import SamplingParams, decode_group, encode_group

SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12)
PROMPTS = ["3 + 4 =", "9 - 8 =", "1 + 1 ="]


def _node(lm: Any, lr: float = 3e-4, **kw: Any) -> Learner:
    return Learner(
        lm.model,
        lm.tokenizer,
        TaskSource(preset("cpu_easy")),
        LearnerSettings(sampling=SAMPLING, trainer=TrainerConfig(lr=lr), **kw),
        model_id=lm.model_id,
    )


def _teacher_forced_logprobs(lm: Any, prompt: str, ids: tuple[int, ...]) -> list[float]:
    p = lm.tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([p + list(ids)])).logits[0, :-1]
    logp = torch.log_softmax(logits.float(), -1)
    return [float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(ids)]


def test_build_recorded_a_reward_above_zero_and_is_reused_from_cache(
    tiny_dir: Path, tiny_cache: Path, test_tiny_spec: Any
) -> None:
    report = read_report(tiny_dir)
    # Sampled rewards of a model trained on this CPU (both differ between CPUs, issue 54), so
    # a bound with its reason: untrained, the model spells no tagged right answer (0.0); the
    # warm start, 10 % of it tagged, left 6 of 128 eval samples rewarded here (0.047, tag
    # rate 0.086), so none at all is about e^-6 = 0.25 % likely (Poisson), and 0.5 would
    # need far more tagged answers than the 10 % it was taught.
    assert report.reward_before < report.reward_after < 0.5
    stamp = (tiny_dir / "build.json").stat().st_mtime_ns
    assert ensure_tiny_model(test_tiny_spec, tiny_cache) == tiny_dir
    assert (tiny_dir / "build.json").stat().st_mtime_ns == stamp
    manifest = json.loads((tiny_dir / "build.json").read_text())
    assert manifest["tokenizer_id"] == tokenizer_id(load_model(tiny_dir).tokenizer)


def test_generator_returns_n_completions_whose_logprobs_match_the_model(tiny_lm: Any) -> None:
    gen = TransformersGenerator(tiny_lm.model, tiny_lm.tokenizer, model_id="t")
    results = gen.generate_sync(PROMPTS, SAMPLING, n=4, seed=1)
    assert [r.prompt for r in results] == PROMPTS
    for res in results:
        assert len(res.completions) == 4
        for comp in res.completions:
            assert comp.token_ids is not None
            assert comp.logprobs is not None
            assert len(comp.token_ids) == len(comp.logprobs) >= 1
            assert comp.finish_reason in ("stop", "length")
            if comp.finish_reason == "stop":
                assert comp.token_ids[-1] == tiny_lm.tokenizer.eos_token_id
            # left-padded batched sampling agrees with an unpadded teacher-forced pass
            expected = _teacher_forced_logprobs(tiny_lm, res.prompt, comp.token_ids)
            assert comp.logprobs == pytest.approx(expected, abs=1e-4)


def test_same_seed_gives_same_completions_and_another_seed_differs(tiny_lm: Any) -> None:
    gen = TransformersGenerator(tiny_lm.model, tiny_lm.tokenizer, model_id="t")
    a = gen.generate_sync(PROMPTS, SAMPLING, n=8, seed=5)
    b = gen.generate_sync(PROMPTS, SAMPLING, n=8, seed=5)
    c = gen.generate_sync(PROMPTS, SAMPLING, n=8, seed=6)
    assert a == b
    assert a != c


def test_top_k_one_is_greedy_and_a_short_cap_finishes_by_length(tiny_lm: Any) -> None:
    gen = TransformersGenerator(tiny_lm.model, tiny_lm.tokenizer, model_id="t")
    greedy = gen.generate_sync(PROMPTS, SamplingParams(top_k=1, max_new_tokens=12), n=4, seed=0)
    for res in greedy:
        assert len({c.text for c in res.completions}) == 1
    short = gen.generate_sync(PROMPTS, SamplingParams(max_new_tokens=1), n=4, seed=0)
    for res in short:
        for comp in res.completions:
            assert comp.token_ids is not None
            assert len(comp.token_ids) == 1
            eos = comp.token_ids[0] == tiny_lm.tokenizer.eos_token_id
            assert comp.finish_reason == ("stop" if eos else "length")


def test_sync_weights_is_a_no_op_when_shared_and_loads_into_a_copy(tiny_lm: Any) -> None:
    shared = TransformersGenerator(tiny_lm.model, tiny_lm.tokenizer, model_id="t")
    anyio.run(shared.sync_weights, [])
    copy = load_model(Path(tiny_lm.path))
    engine = TransformersGenerator(
        copy.model, copy.tokenizer, model_id="t", shares_trainer_module=False
    )
    with torch.no_grad():
        for p in tiny_lm.model.parameters():
            p.add_(0.01)
    anyio.run(engine.sync_weights, list(tiny_lm.model.state_dict().items()))
    for (_, a), (_, b) in zip(
        tiny_lm.model.state_dict().items(), copy.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b)


def _group(lm: Any, rewards: list[float], *, text_only: bool = False) -> ScoredGroup:
    gen = TransformersGenerator(lm.model, lm.tokenizer, model_id="t")
    res = gen.generate_sync(["3 + 4 ="], SAMPLING, n=len(rewards), seed=3)[0]
    comps = tuple(
        ScoredCompletion(
            text=c.text,
            reward=r,
            finish_reason=c.finish_reason,
            token_ids=None if text_only else c.token_ids,
            behaviour_logprobs=None if text_only else c.logprobs,
        )
        for c, r in zip(res.completions, rewards, strict=True)
    )
    return ScoredGroup(
        prompt=res.prompt,
        completions=comps,
        tokenizer_id=None if text_only else tokenizer_id(lm.tokenizer),
        producer="local" if not text_only else "0xpeer",
        token_source=TokenSource.TEXT if text_only else TokenSource.SAMPLED,
    )


def test_trainer_skips_a_batch_without_informative_groups(tiny_lm: Any) -> None:
    trainer = Trainer(tiny_lm.model, tiny_lm.tokenizer, TrainerConfig(lr=1e-3))
    before = [p.detach().clone() for p in tiny_lm.model.parameters()]
    m = trainer.step([_group(tiny_lm, [0.0] * 4), _group(tiny_lm, [1.0] * 4)])
    assert m.skipped
    assert m.zero_std_fraction == 1.0
    assert trainer.policy_version == 0
    for a, b in zip(before, tiny_lm.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_trainer_steps_on_mixed_local_and_text_only_external_groups(
    tiny_lm: Any, aggregation: str
) -> None:
    trainer = Trainer(
        tiny_lm.model,
        tiny_lm.tokenizer,
        TrainerConfig(lr=1e-3, loss_type=aggregation, tis_cap=2.0, minibatches=2),
    )
    before = [p.detach().clone() for p in tiny_lm.model.parameters()]
    groups = [
        _group(tiny_lm, [1.0, 0.0, 0.0, 0.0]),
        _group(tiny_lm, [0.5, 0.5, 0.5, 0.5]),
        _group(tiny_lm, [0.0, 1.0, 1.0, 0.0], text_only=True),
    ]
    m = trainer.step(groups)
    assert not m.skipped
    assert m.groups == 3
    assert m.groups_used == 2
    assert m.external_groups == 1
    assert m.retokenised == 4
    assert m.sequences == 8
    assert m.zero_std_fraction == pytest.approx(1 / 3)
    assert m.reward_mean == pytest.approx((1 + 2 + 2) / 12)
    assert m.entropy > 0
    assert m.grad_norm > 0
    assert trainer.policy_version == 2  # two minibatches, one epoch
    changed = any(
        not torch.equal(a, b) for a, b in zip(before, tiny_lm.model.parameters(), strict=True)
    )
    assert changed


def test_kl_to_a_frozen_reference_is_zero_before_any_update_and_grows_once_the_policy_moved(
    tiny_lm: Any,
) -> None:
    # One epoch, one minibatch: a step's KL is measured before its own update. The first
    # is the initial model against its frozen copy (zero); the second, the moved policy
    # against that same copy (a reference that followed the policy would give zero again).
    trainer = Trainer(tiny_lm.model, tiny_lm.tokenizer, TrainerConfig(lr=3e-3, kl_beta=0.04))
    first = trainer.step([_group(tiny_lm, [1.0, 0.0, 0.0, 1.0])])
    second = trainer.step([_group(tiny_lm, [1.0, 0.0, 0.0, 1.0])])
    assert first.kl == pytest.approx(0.0, abs=1e-6)
    assert second.kl > 1e-4


def test_external_group_round_trips_the_wire_and_scores_like_the_producer(tiny_lm: Any) -> None:
    node = _node(tiny_lm)
    generated = anyio.run(node.generate)
    local = node.score_local(generated)
    wire = [
        to_rollout_group(
            g,
            swarm="s",
            producer="0xabc",
            producer_round=node.round,
            policy_version=node.policy_version,
            model_id=node.model_id,
            tokenizer_id=node.tokenizer_id,
        )
        for g in generated
    ]
    for group, mine in zip(wire, local, strict=True):
        back = decode_group(encode_group(group))
        scored = node.score_external(back)
        assert scored.rewards == mine.rewards
        assert scored.prompt == mine.prompt
        assert scored.producer == "0xabc"
    forged = wire[0].__class__(
        **{f: getattr(wire[0], f) for f in wire[0].__struct_fields__ if f != "answer"},
        answer=wire[0].answer + "1",
    )
    with pytest.raises(RejectedInput) as info:
        node.score_external(forged)
    assert info.value.reason == "task_mismatch"


def test_fake_generator_drives_a_round_through_text_only_completions(tiny_lm: Any) -> None:
    def script(prompt: str, i: int, seed: int | None) -> str:
        a, op, b = prompt.split()[:3]
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        return f" <answer>{value}</answer>" if i % 2 == 0 else " 0"

    fake = FakeGenerator(script)
    node = Learner(
        tiny_lm.model,
        tiny_lm.tokenizer,
        TaskSource(preset("cpu_easy")),
        LearnerSettings(sampling=SAMPLING, trainer=TrainerConfig(lr=1e-3)),
        generator=fake,
    )
    (m,) = run_alone(node, 1)
    assert m.reward_mean == pytest.approx(0.5)
    assert m.informative_local == 8
    assert m.local_used == 8
    assert m.external_total == 0
    assert m.step["retokenised"] == 64
    assert not m.step["skipped"]
    assert fake.calls[0].n == 8
    assert extract_answer(script("2 + 3 =", 0, None)) == "5"


def _state(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_from_checkpoint_gives_the_same_next_round(
    tiny_dir: Path, tmp_path: Path, torch_one_thread: None
) -> None:
    a = _node(load_model(tiny_dir), lr=1e-3)
    run_alone(a, 4)
    a.save(tmp_path / "ck")
    next_a = run_alone(a, 2)
    b = _node(load_model(tiny_dir), lr=1e-3)
    b.restore(tmp_path / "ck")
    assert b.round == 4
    assert b.policy_version == a.policy_version - sum(not m.step["skipped"] for m in next_a)
    next_b = run_alone(b, 2)
    assert a.policy_version > 0
    for ma, mb in zip(next_a, next_b, strict=True):
        assert ma.round == mb.round
        assert ma.reward_mean == mb.reward_mean
        assert ma.step["loss"] == mb.step["loss"]
    sa, sb = _state(a.model), _state(b.model)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_torn_checkpoint_is_refused(tiny_lm: Any, tmp_path: Path) -> None:
    node = _node(tiny_lm)
    path = node.save(tmp_path / "ck")
    with (path / "model.safetensors").open("r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x00" * 8)
    with pytest.raises(CheckpointError, match="torn"):
        load_checkpoint(tmp_path / "ck", model=tiny_lm.model)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty", model=tiny_lm.model)


def _flip_a_byte(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_flipped_byte_falls_back_to_the_previous_checkpoint_and_keeps_the_damaged_one(
    tiny_lm: Any, tmp_path: Path
) -> None:
    # A flipped byte in the newest checkpoint stopped the node with a traceback although
    # the previous checkpoint (kept by the rotation) was intact.
    node = _node(tiny_lm)
    node.set_round(2)
    node.save(tmp_path / "ck")
    at_round_2 = _state(node.model)
    with torch.no_grad():
        for p in node.model.parameters():
            p.add_(1.0)
    node.set_round(4)
    newest = node.save(tmp_path / "ck")
    flipped = _flip_a_byte(newest / "model.safetensors")

    fresh = _node(tiny_lm)
    state = fresh.restore(tmp_path / "ck")
    assert (state.round, fresh.round) == (2, 2)
    assert state.path == tmp_path / "ck" / "round-00000002"
    restored = _state(fresh.model)
    assert all(torch.equal(restored[k], at_round_2[k]) for k in at_round_2)
    (damaged,) = state.damaged
    assert damaged.path == newest
    assert "torn" in damaged.reason
    assert damaged.kept_as == tmp_path / "ck" / "damaged-round-00000004"
    assert (damaged.kept_as / "model.safetensors").read_bytes() == flipped
    # The next save neither overwrites nor rotates the damaged copy away.
    fresh.set_round(4)
    fresh.save(tmp_path / "ck")
    fresh.set_round(6)
    fresh.save(tmp_path / "ck")
    assert (damaged.kept_as / "model.safetensors").read_bytes() == flipped


def test_a_manifest_that_lists_no_digests_is_damage_and_resume_falls_back(
    tiny_lm: Any, tmp_path: Path
) -> None:
    # `files = {}` beside a truncated model.safetensors left nothing to check the file
    # against: the loader met the torn file and raised SafetensorError with a traceback.
    node = _node(tiny_lm)
    node.set_round(2)
    node.save(tmp_path / "ck")
    node.set_round(4)
    newest = node.save(tmp_path / "ck")
    manifest = json.loads((newest / "manifest.json").read_text())
    (newest / "manifest.json").write_text(json.dumps({**manifest, "files": {}}))
    model_file = newest / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:100])

    state = _node(tiny_lm).restore(tmp_path / "ck")
    assert state.round == 2
    (damaged,) = state.damaged
    assert damaged.path == newest
    assert damaged.reason == "the manifest lists no digest for model.safetensors (cannot check it)"
    only = tmp_path / "only"
    shutil.copytree(damaged.kept_as, only / "round-00000004")
    with pytest.raises(CheckpointError, match=r"lists no digest for model\.safetensors"):
        load_checkpoint(only, model=tiny_lm.model)


def test_a_damaged_latest_pointer_still_finds_the_newest_checkpoint(
    tiny_lm: Any, tmp_path: Path
) -> None:
    node = _node(tiny_lm)
    node.set_round(3)
    node.save(tmp_path / "ck")
    (tmp_path / "ck" / "LATEST").write_bytes(b"\xff\xfe round-0000")
    state = _node(tiny_lm).restore(tmp_path / "ck")
    assert state.round == 3
    assert state.damaged == ()


def test_with_no_good_checkpoint_left_the_error_names_each_and_changes_nothing(
    tiny_lm: Any, tmp_path: Path
) -> None:
    node = _node(tiny_lm)
    path = node.save(tmp_path / "ck")
    (path / "manifest.json").write_text("{")
    before = sorted(p.name for p in (tmp_path / "ck").iterdir())
    with pytest.raises(CheckpointError) as caught:
        _node(tiny_lm).restore(tmp_path / "ck")
    message = str(caught.value)
    assert str(path) in message
    assert "manifest" in message
    assert "move it aside" in message
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == before


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_grpo_rounds_raise_training_reward_on_a_fixed_seed(tiny_lm: Any) -> None:
    node = _node(tiny_lm, lr=3e-4)
    metrics = run_alone(node, 60)
    rewards = [m.reward_mean for m in metrics]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    # A learning outcome is sampled, and sampling differs between CPUs (issue 54): the fixed
    # seed fixes one machine's draw, not another's. So these are bounds with their margin
    # measured: run with node_index 0 to 4 (other questions and draws, the stand-in for
    # another CPU's arithmetic), the first ten rounds' mean was 0.016 to 0.039 and the last
    # ten's 0.19 to 0.32, a rise of 0.17 to 0.28 (over 3x the 0.05 asked) and 7x to 12x (over
    # 3x the 2x asked). A node that does not learn (no step, a wrong sign) stays near first.
    assert last > first + 0.05, (first, last)
    assert last > 2 * first
    assert node.policy_version == sum(not m.step["skipped"] for m in metrics)


def test_cli_train_writes_a_jsonl_line_per_round_and_a_checkpoint(
    tiny_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "train.jsonl"
    result = CliRunner().invoke(
        build_app(),
        [
            "train",
            "--rounds",
            "3",
            "--model",
            str(tiny_dir),
            "--tasks",
            "cpu_easy",
            "--log",
            str(log),
            "--checkpoint-dir",
            str(tmp_path / "ck"),
            "--lr",
            "1e-3",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["round"] for x in lines] == [0, 1, 2]
    assert {"generate_s", "score_s", "train_s", "step_reward_mean", "step_grad_norm"} <= set(
        lines[0]
    )
    assert (tmp_path / "ck" / "LATEST").read_text() == "round-00000003"


def test_trainer_truncates_long_external_completions_to_the_cap(tiny_lm: Any) -> None:
    trainer = Trainer(tiny_lm.model, tiny_lm.tokenizer, TrainerConfig(max_completion_tokens=5))
    long_text = " <answer>" + "1" * 40 + "</answer>"
    group = ScoredGroup(
        prompt="3 + 4 =",
        completions=(
            ScoredCompletion(text=long_text, reward=1.0),
            ScoredCompletion(text=" 7", reward=0.0),
        ),
        producer="0xpeer",
        token_source=TokenSource.TEXT,
    )
    m = trainer.step([group])
    assert m.retokenised == 2
    assert m.tokens == 5 + 3  # the long one capped at 5; " 7" is space, 7 and EOS


def test_a_peers_token_ids_are_never_trained_on_only_its_texts_tokenisation(tiny_lm: Any) -> None:
    tok = tiny_lm.tokenizer
    tid = tokenizer_id(tok)
    eos = tok.eos_token_id
    honest = [*tok(" <answer>7</answer>", add_special_tokens=False)["input_ids"], eos]
    poisoned = list(tok(" <answer>7</answer> 1 1 1 1", add_special_tokens=False)["input_ids"])
    comps = (
        ScoredCompletion(" <answer>7</answer>", 1.0, "stop", tuple(honest), (-0.1,) * len(honest)),
        ScoredCompletion(" <answer>7</answer>", 1.0, "stop", tuple(poisoned), (-0.1,) * 13),
        ScoredCompletion(" 7", 0.0, "stop", None, None),
    )
    group = ScoredGroup(
        prompt="3 + 4 =",
        completions=comps,
        tokenizer_id=tid,
        producer="0xpeer",
        token_source=TokenSource.TEXT,
    )
    trainer = Trainer(tiny_lm.model, tok, TrainerConfig(tis_cap=2.0))
    metrics = trainer.step([group])
    # the honest ids equal the text's tokenisation (kept with log-probs); the poisoned ids
    # and the text-only completion are re-tokenised from their texts
    assert metrics.retokenised == 2
    assert metrics.tokens == 2 * len(honest) + 3


def test_both_generators_satisfy_the_generation_port(tiny_lm: Any) -> None:
    real = TransformersGenerator(tiny_lm.model, tiny_lm.tokenizer, model_id="t")
    assert isinstance(real, Generator)
    assert isinstance(FakeGenerator(lambda p, i, s: ""), Generator)
    assert real.tokenizer_id == tokenizer_id(tiny_lm.tokenizer)


def test_a_lone_node_runs_rounds_from_its_round_and_the_counter_refuses_a_negative_round(
    tiny_lm: Any,
) -> None:
    node = _node(tiny_lm)
    node.set_round(5)
    reports = run_alone(node, 2)
    assert [r.round for r in reports] == [5, 6]
    assert node.round == 7
    assert all(r.external_total == 0 and r.groups_shared == r.local_used for r in reports)
    assert all(r.generated_tokens > 0 for r in reports)
    with pytest.raises(ValueError, match="round must be >= 0"):
        node.set_round(-1)
