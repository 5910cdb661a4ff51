"""One conformance suite for every generation backend (the promises of policy/generation/base.py).

Run against the scripted fake, the transformers backend on the tests' tiny model, and the
vLLM backend over the vLLM stand-in (tests/unit/fake_vllm.py, a real tiny torch model
behind vLLM 0.33.0's signatures).

Where a backend legitimately differs it says so in its :class:`Backend` record, and the
test asserts the documented difference instead of skipping:

* the fake is scripted text: it returns no token ids or log-probs (like a peer's text-only
  group), so the token-level promises hold vacuously and are asserted as ``None``; and it
  validates no sampling parameters (a script has nothing to sample), so out-of-range
  parameters are asserted to be accepted there;
* the transformers and vLLM backends return ids with log-probs and reject out-of-range
  parameters with :class:`ConfigError` before touching the model.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from sapo_async.errors import ConfigError, GenerationError
from sapo_async.policy.generation.base import Generator
from sapo_async.policy.generation.fake import FakeGenerator
from sapo_async.policy.generation.transformers_backend import TransformersGenerator
from sapo_async.policy.generation.vllm_backend import VllmGenerator, VllmSettings
from sapo_async.wire import SamplingParams
from tests.unit import fake_vllm

pytestmark = pytest.mark.anyio

PROMPTS = ["1 + 2 =", "3 * 4 =", "9 - 5 ="]
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=5)


@dataclass
class Backend:
    """A generator under test and what its backend promises beyond the port.

    Attributes:
        generator: the backend.
        weights: named tensors it may be synced with (its own current weights).
        samples_tokens: returns token ids and per-token log-probs (else text only).
        validates_sampling: rejects out-of-range sampling parameters.
    """

    generator: Generator
    weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]
    samples_tokens: bool
    validates_sampling: bool


BackendFactory = Callable[[], Awaitable[Backend]]


def _script(prompt: str, index: int, seed: int | None) -> str:
    return f"{prompt} {index} {seed}"


@pytest.fixture(scope="module")
def vllm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vllm.save_tiny_checkpoint(tmp_path_factory.mktemp("vllm") / "model", seed=0)


@pytest.fixture(params=["fake", "transformers", "vllm"])
async def backend_factory(
    request: pytest.FixtureRequest, vllm_checkpoint: Path
) -> AsyncIterator[BackendFactory]:
    made: list[Generator] = []

    async def make() -> Backend:
        backend = await _build(request.param, request, vllm_checkpoint)
        made.append(backend.generator)
        return backend

    yield make
    for generator in made:
        await generator.aclose()


async def _build(name: str, request: pytest.FixtureRequest, checkpoint: Path) -> Backend:
    if name == "fake":
        return Backend(FakeGenerator(_script), lambda: [], False, False)
    if name == "transformers":
        lm = request.getfixturevalue("tiny_lm")
        gen = TransformersGenerator(lm.model, lm.tokenizer, model_id="test-tiny")
        return Backend(gen, lm.model.named_parameters, True, True)
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    vllm = await VllmGenerator.create(
        VllmSettings(model=str(checkpoint), dtype="float32"),
        trainer_model=trainer,
        api=fake_vllm.fake_api(),
        transfer_device="cpu",
    )
    return Backend(vllm, trainer.named_parameters, True, True)


async def test_every_backend_is_a_generator_naming_its_model(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    assert isinstance(backend.generator, Generator)
    assert isinstance(backend.generator.model_id, str)
    assert backend.generator.model_id


async def test_each_prompt_gets_exactly_n_completions_in_prompt_order(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    results = await backend.generator.generate(PROMPTS, SAMPLING, n=3, seed=7)
    assert [r.prompt for r in results] == PROMPTS
    assert [len(r.completions) for r in results] == [3, 3, 3]


async def test_no_prompts_give_no_results(backend_factory: BackendFactory) -> None:
    backend = await backend_factory()
    assert await backend.generator.generate([], SAMPLING, n=2, seed=1) == []


async def test_token_ids_come_with_one_finite_log_probability_each(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    results = await backend.generator.generate(PROMPTS, SAMPLING, n=2, seed=3)
    for comp in (c for r in results for c in r.completions):
        if not backend.samples_tokens:  # the scripted fake: text only, declared above
            assert comp.token_ids is None
            assert comp.logprobs is None
            continue
        assert comp.token_ids is not None
        assert comp.logprobs is not None
        assert len(comp.token_ids) == len(comp.logprobs) >= 1
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in comp.logprobs)
    if backend.samples_tokens:
        assert all(r.prompt_token_ids for r in results)


async def test_every_completion_finishes_by_stop_or_length(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    results = await backend.generator.generate(PROMPTS, SAMPLING, n=3, seed=5)
    assert {c.finish_reason for r in results for c in r.completions} <= {"stop", "length"}


async def test_no_completion_passes_max_new_tokens_and_length_means_it_reached_it(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    short = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=2)
    results = await backend.generator.generate(PROMPTS, short, n=4, seed=11)
    for comp in (c for r in results for c in r.completions):
        if not backend.samples_tokens:  # no tokens to count: declared above
            assert comp.token_ids is None
            continue
        assert comp.token_ids is not None
        assert 1 <= len(comp.token_ids) <= short.max_new_tokens
        if comp.finish_reason == "length":
            assert len(comp.token_ids) == short.max_new_tokens


async def test_the_same_seed_gives_the_same_completions(backend_factory: BackendFactory) -> None:
    backend = await backend_factory()
    first = await backend.generator.generate(PROMPTS, SAMPLING, n=3, seed=42)
    again = await backend.generator.generate(PROMPTS, SAMPLING, n=3, seed=42)
    assert first == again


async def test_syncing_the_weights_it_has_changes_no_completion_for_a_seed(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    before = await backend.generator.generate(PROMPTS, SAMPLING, n=2, seed=9)
    await backend.generator.sync_weights(backend.weights())
    after = await backend.generator.generate(PROMPTS, SAMPLING, n=2, seed=9)
    assert before == after


@pytest.mark.parametrize(
    "bad",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(top_p=1.5),
        SamplingParams(top_k=-1),
        SamplingParams(max_new_tokens=0),
    ],
    ids=["temperature", "top_p", "top_k", "max_new_tokens"],
)
async def test_out_of_range_sampling_parameters_are_a_config_error(
    backend_factory: BackendFactory, bad: SamplingParams
) -> None:
    backend = await backend_factory()
    if not backend.validates_sampling:  # the scripted fake samples nothing: declared above
        assert len(await backend.generator.generate(PROMPTS, bad, n=1, seed=0)) == len(PROMPTS)
        return
    with pytest.raises(ConfigError):
        await backend.generator.generate(PROMPTS, bad, n=1, seed=0)


async def test_a_closed_backend_raises_generation_error_and_closes_twice_quietly(
    backend_factory: BackendFactory,
) -> None:
    backend = await backend_factory()
    await backend.generator.aclose()
    await backend.generator.aclose()
    with pytest.raises(GenerationError):
        await backend.generator.generate(PROMPTS, SAMPLING, n=1, seed=0)
