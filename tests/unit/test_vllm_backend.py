"""The vLLM backend's generate / sync / probe / sleep-wake flow, against the CPU fake.

The fake (tests/unit/fake_vllm.py) mirrors vLLM 0.33.0's signatures and runs a real tiny
transformers model, so log-probs, weight loads and probes are real torch computations.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
import torch
from transformers import AutoModelForCausalLM

from sapo_async.errors import ConfigError, GenerationError, WeightSyncError
from sapo_async.policy.generation.base import Generator
from sapo_async.policy.generation.probe import causal_lm_token_logprobs
from sapo_async.policy.generation.vllm_backend import (
    VllmGenerator,
    VllmSettings,
    load_vllm_api,
    to_vllm_sampling_params,
)
from sapo_async.wire import SamplingParams
from tests.unit import fake_vllm

T = TypeVar("T")
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6)


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(fn)


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vllm.save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def trainer_from(checkpoint: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)


def make(checkpoint: Path, *, sleep_level: int = 0, trainer: Any = None) -> VllmGenerator:
    settings = VllmSettings(model=str(checkpoint), dtype="float32", sleep_level=sleep_level)  # type: ignore[arg-type]
    return run(
        lambda: VllmGenerator.create(
            settings,
            trainer_model=trainer if trainer is not None else trainer_from(checkpoint),
            api=fake_vllm.fake_api(),
            transfer_device="cpu",
        )
    )


def train_one_step(model: Any) -> None:
    """A real optimizer step, big enough that the old engine weights fail the probe."""
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    ids = torch.tensor([[5, 17, 42, 99, 3, 64, 8]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def llm(gen: VllmGenerator) -> fake_vllm.LLM:
    return gen._llm  # type: ignore[no-any-return]


# --- generation -----------------------------------------------------------------------


def test_backend_satisfies_the_generator_protocol(checkpoint: Path) -> None:
    assert isinstance(make(checkpoint), Generator)


def test_generate_returns_n_completions_with_per_token_logprobs(checkpoint: Path) -> None:
    gen = make(checkpoint)
    results = run(lambda: gen.generate(["12 + 7 =", "3 * 4 ="], SAMPLING, n=3, seed=1))

    assert [r.prompt for r in results] == ["12 + 7 =", "3 * 4 ="]
    for r in results:
        assert len(r.completions) == 3
        assert r.prompt_token_ids
        for c in r.completions:
            assert c.token_ids is not None
            assert c.logprobs is not None
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert c.finish_reason in ("stop", "length")
    assert gen.statistics().generated_tokens == sum(
        len(c.token_ids or ()) for r in results for c in r.completions
    )


def test_generated_logprobs_equal_the_trainers_temperature_one_logprobs(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, trainer=trainer)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=5)
    (result,) = run(lambda: gen.generate(["40 + 2 ="], sampling, n=2, seed=3))

    for c in result.completions:
        assert c.token_ids is not None
        assert c.logprobs is not None
        seq = list(result.prompt_token_ids) + list(c.token_ids)
        expected = causal_lm_token_logprobs(trainer, seq)[len(result.prompt_token_ids) - 1 :]
        assert list(c.logprobs) == pytest.approx(expected, abs=1e-4)


def test_same_seed_gives_same_completions_and_prompts_get_distinct_seeds(checkpoint: Path) -> None:
    gen = make(checkpoint)
    first = run(lambda: gen.generate(["a", "a"], SAMPLING, n=2, seed=9))
    again = run(lambda: gen.generate(["a", "a"], SAMPLING, n=2, seed=9))

    assert first == again
    # the same prompt twice in one call is sampled with different seeds
    assert first[0].completions != first[1].completions


def test_sampling_params_map_onto_vllm_0_33() -> None:
    api = fake_vllm.fake_api()
    params = to_vllm_sampling_params(
        api, SamplingParams(temperature=0.8, top_p=0.95, top_k=0, max_new_tokens=128), n=8, seed=5
    )
    assert params == fake_vllm.SamplingParams(
        n=8, temperature=0.8, top_p=0.95, top_k=0, max_tokens=128, seed=5, logprobs=0
    )


@pytest.mark.parametrize(
    ("sampling", "n", "field"),
    [
        (SAMPLING, 0, "training.completions_per_question"),
        (SamplingParams(temperature=0.0), 1, "training.temperature"),
        (SamplingParams(top_p=1.5), 1, "training.top_p"),
        (SamplingParams(top_k=-1), 1, "training.top_k"),
        (SamplingParams(max_new_tokens=0), 1, "training.max_new_tokens"),
    ],
)
def test_bad_sampling_params_are_rejected_by_name(
    sampling: SamplingParams, n: int, field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        to_vllm_sampling_params(fake_vllm.fake_api(), sampling, n=n, seed=None)
    assert caught.value.field == field


def test_vllm_errors_are_translated_into_generation_errors(checkpoint: Path) -> None:
    gen = make(checkpoint)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access")

    llm(gen).generate = boom  # type: ignore[method-assign]
    with pytest.raises(GenerationError, match="illegal memory access") as caught:
        run(lambda: gen.generate(["x"], SAMPLING, n=1))
    assert isinstance(caught.value.__cause__, RuntimeError)


# --- weight sync and probe ------------------------------------------------------------


def test_sync_pushes_trained_weights_into_the_engine_and_probes(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, trainer=trainer)
    initial = run(gen.probe)
    assert initial.mean_abs_diff < 1e-5

    train_one_step(trainer)
    with pytest.raises(WeightSyncError):
        run(gen.probe)  # the engine still holds the old weights

    run(lambda: gen.sync_weights(trainer.named_parameters(), policy_version=1))

    stats = gen.statistics()
    assert stats.syncs == 1
    assert stats.weight_version == 1
    assert stats.last_probe is not None
    assert stats.last_probe.mean_abs_diff < 1e-5
    engine_params = dict(llm(gen).model.named_parameters())
    for name, p in trainer.named_parameters():
        assert torch.equal(engine_params[name], p.detach())
    assert llm(gen).calls[-5:] == [
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "reset_prefix_cache",
        "generate",  # the probe's prompt-logprob request
    ]
    assert llm(gen).get_weight_version() == "1"
    run(lambda: gen.generate(["ok"], SAMPLING, n=1))


def test_transfer_is_initialised_once_and_reused(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, trainer=trainer)
    for version in (1, 2, 3):
        train_one_step(trainer)
        run(lambda v=version: gen.sync_weights(trainer.named_parameters(), policy_version=v))  # type: ignore[misc]
    assert llm(gen).calls.count("init_weight_transfer_engine") == 1
    assert llm(gen).calls.count("update_weights") == 3


def test_silently_dropped_weight_update_is_caught_by_the_probe(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, trainer=trainer)
    llm(gen).drop_weight_updates = True
    train_one_step(trainer)

    with pytest.raises(WeightSyncError) as caught:
        run(lambda: gen.sync_weights(trainer.named_parameters(), policy_version=1))

    assert caught.value.mismatch > caught.value.threshold
    assert gen.statistics().failed_probes == 1
    with pytest.raises(GenerationError, match="did not pass the probe"):
        run(lambda: gen.generate(["x"], SAMPLING, n=1))

    llm(gen).drop_weight_updates = False
    run(lambda: gen.sync_weights(trainer.named_parameters(), policy_version=1))
    run(lambda: gen.generate(["x"], SAMPLING, n=1))  # usable again once a probe passes


def test_sync_without_a_trainer_model_refuses_to_run_unverified(checkpoint: Path) -> None:
    gen = make(checkpoint)
    gen._trainer_model = None
    with pytest.raises(GenerationError, match="no trainer model attached"):
        run(lambda: gen.sync_weights(trainer_from(checkpoint).named_parameters()))


def test_sync_with_different_tensor_names_is_rejected(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, trainer=trainer)
    run(lambda: gen.sync_weights(trainer.named_parameters()))
    renamed = [(f"x.{name}", p) for name, p in trainer.named_parameters()]
    with pytest.raises(GenerationError, match="names/shapes"):
        run(lambda: gen.sync_weights(renamed))


# --- sleep / wake ---------------------------------------------------------------------


def test_level_one_sleep_releases_the_engine_and_wake_restores_and_probes(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, sleep_level=1, trainer=trainer)
    run(gen.sleep)
    assert gen.statistics().asleep
    with pytest.raises(GenerationError, match="asleep"):
        run(lambda: gen.generate(["x"], SAMPLING, n=1))

    run(gen.wake_up)

    assert not gen.statistics().asleep
    assert gen.last_probe is not None
    assert gen.last_probe.ok
    assert "wake_up(None)" in llm(gen).calls


def test_level_one_sleep_around_a_training_step_syncs_on_wake(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, sleep_level=1, trainer=trainer)
    run(gen.sleep)
    train_one_step(trainer)

    run(lambda: gen.wake_up(trainer.named_parameters(), policy_version=1))

    calls = llm(gen).calls
    assert calls.index("wake_up(None)") < calls.index("update_weights")
    assert gen.last_probe is not None
    assert gen.last_probe.mean_abs_diff < 1e-5
    run(lambda: gen.generate(["x"], SAMPLING, n=1))


def test_level_two_wake_reloads_weights_before_the_kv_cache(checkpoint: Path) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, sleep_level=2, trainer=trainer)
    run(gen.sleep)
    train_one_step(trainer)

    with pytest.raises(GenerationError, match="level-2"):
        run(gen.wake_up)  # weights were discarded: must be given them

    run(lambda: gen.wake_up(trainer.named_parameters(), policy_version=1))

    calls = llm(gen).calls
    order = [
        calls.index("wake_up(['weights'])"),
        calls.index("update_weights"),
        calls.index("wake_up(['kv_cache'])"),
    ]
    assert order == sorted(order)
    assert gen.last_probe is not None
    assert gen.last_probe.mean_abs_diff < 1e-5


def test_probe_catches_gibberish_after_a_level_two_wake_without_reload(checkpoint: Path) -> None:
    # The failure TRL and verl users hit: waking from level 2 and generating at once.
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, sleep_level=2, trainer=trainer)
    run(gen.sleep)
    llm(gen).wake_up()  # bypass the backend, as a naive caller would
    gen._asleep = False

    with pytest.raises(WeightSyncError):
        run(gen.probe)


def test_sleep_is_a_no_op_at_level_zero(checkpoint: Path) -> None:
    gen = make(checkpoint)
    run(gen.sleep)
    assert not gen.statistics().asleep
    assert not any(c.startswith("sleep") for c in llm(gen).calls)


# --- construction and lifecycle -------------------------------------------------------


def test_create_configures_ipc_weight_transfer_and_sleep_mode(checkpoint: Path) -> None:
    gen = make(checkpoint, sleep_level=1)
    kwargs = llm(gen).engine_kwargs
    assert kwargs["weight_transfer_config"] == {"backend": "ipc"}
    assert kwargs["enable_sleep_mode"] is True
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.3)
    assert gen.model_id == str(checkpoint)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpu_memory_utilization": 1.0}, "model.gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0.0}, "model.gpu_memory_utilization"),
        ({"sleep_level": 3}, "model.sleep_mode"),
        ({"probe_threshold": 0.0}, "probe_threshold"),
        ({"engine_kwargs": {"enable_sleep_mode": False}}, "engine_kwargs"),
        ({"model": ""}, "model.name_or_path"),
    ],
)
def test_bad_settings_are_rejected_by_field(kwargs: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {"model": "m"}
    with pytest.raises(ConfigError) as caught:
        VllmSettings(**{**base, **kwargs})
    assert caught.value.field == field


def test_missing_vllm_is_a_clear_generation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(GenerationError, match=r"pip install 'sapo_async\[gpu\]'"):
        load_vllm_api()


def test_aclose_is_idempotent_and_closes_the_door(checkpoint: Path) -> None:
    gen = make(checkpoint)
    run(gen.aclose)
    run(gen.aclose)
    with pytest.raises(GenerationError, match="closed"):
        run(lambda: gen.generate(["x"], SAMPLING, n=1))


def test_aclose_shuts_the_engine_core_process_down(checkpoint: Path) -> None:
    gen = make(checkpoint)
    stopped: list[bool] = []

    class Core:
        def shutdown(self, timeout: float | None = None) -> None:
            stopped.append(True)

    class Engine:
        engine_core = Core()

    llm(gen).llm_engine = Engine()  # type: ignore[attr-defined]
    run(gen.aclose)
    assert stopped == [True]


def test_level_two_retry_after_a_failed_load_does_not_wake_the_weights_twice(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = trainer_from(checkpoint)
    gen = make(checkpoint, sleep_level=2, trainer=trainer)
    run(gen.sleep)
    real_update = llm(gen).update_weights
    failures = iter([RuntimeError("CUDA error: out of memory")])

    def flaky_update(request: Any) -> None:
        for exc in failures:
            llm(gen)._engine.update_active = False
            raise exc
        real_update(request)

    monkeypatch.setattr(llm(gen), "update_weights", flaky_update)
    with pytest.raises(GenerationError, match="out of memory"):
        run(lambda: gen.wake_up(trainer.named_parameters(), policy_version=1))
    assert gen.statistics().asleep

    run(lambda: gen.wake_up(trainer.named_parameters(), policy_version=1))

    assert llm(gen).calls.count("wake_up(['weights'])") == 1
    assert not gen.statistics().asleep
    assert gen.last_probe is not None
    assert gen.last_probe.ok
