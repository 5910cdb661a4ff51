"""``trainer.bf16``: the step under bfloat16 autocast (float32 master weights, optimizer
and loss) stays near the float32 step, and is refused on a CPU without bf16 instructions.

The tolerances, and why they are enough:

* :data:`BF16_LOGP_ATOL` (mean |delta log-prob| over completion tokens): the bound the
  project already holds a bf16 engine to against the float32 trainer
  (:data:`~sapo_async.limits.PROBE_MAX_LOGPROB_DIFF`); the node's own sampler runs a bf16
  copy, so the behaviour log-probs a step already uses differ from float32 by this much.
  Measured: 0.01 on the tiny model, 0.03 (0.04 with ``share_prompts``) on SmolLM2-135M
  (``tests/integration/test_smollm2_fast_step.py``).
* :data:`BF16_LOSS_RTOL`: the loss sees log-probs through the ratio (exactly 1 at a single
  update, whatever the dtype) and the truncated IS weights ``exp(old - behaviour)``, which an
  error ``d`` in the log-probs moves by a factor ``exp(d)``: the bound on ``d`` bounds the
  loss's relative change. Measured: 7e-6 (dapo_tis here).
* :data:`BF16_GRAD_RTOL` (relative L2 error of the whole gradient; cosine >= 0.995): a
  GRPO gradient is an estimate from a handful of sampled completions whose noise is of the
  order of its own norm, and AdamW normalises each coordinate, so a 10% deterministic
  perturbation changes the step's direction by under 6 degrees, small beside that noise.
  Measured: 0.24% on the tiny model, 6-7% on SmolLM2.

The float32 path itself is held exactly by ``test_grpo_reference.py`` and
``test_grpo_trainer_golden.py``; the reference model there is float64, which autocast
leaves alone, so a bf16 test on it could not fail (the test this file replaces).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sapo_async.errors import ConfigError
from sapo_async.limits import PROBE_MAX_LOGPROB_DIFF
from sapo_async.policy.grpo import Trainer, TrainerConfig
from sapo_async.policy.grpo import logprobs as logprobs_module
from sapo_async.policy.grpo.logprobs import cpu_bf16, token_logprobs
from tests.unit import test_grpo_reference as reference

BF16_LOGP_ATOL = PROBE_MAX_LOGPROB_DIFF
BF16_LOSS_RTOL = PROBE_MAX_LOGPROB_DIFF
BF16_GRAD_RTOL = 0.1
AUTOCAST_SEEN = 1e-4
"""Below this relative gradient change the step did not run in bf16 at all (float32
rounding alone is ~1e-7)."""

needs_bf16 = pytest.mark.skipif(not cpu_bf16(), reason="no bf16 instructions on this CPU")


def _step(name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch, **more: Any) -> Any:
    """Case ``name`` of the recorded reference on its model cast to ``dtype``."""
    build = reference._model
    monkeypatch.setattr(reference, "_model", lambda tok: build(tok).to(dtype))
    return reference.loss_and_grads(name, **more)


def _flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([grads[k].flatten().double() for k in sorted(grads)])


@needs_bf16
@pytest.mark.parametrize("name", ["dapo", "dapo_tis", "grpo_tis"])
def test_the_bf16_step_stays_near_the_float32_step(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = _step(name, torch.float32, monkeypatch)
    bf16 = _step(name, torch.float32, monkeypatch, bf16=True)
    assert bf16["tokens"] == exact["tokens"]
    assert bf16["loss"] == pytest.approx(exact["loss"], rel=BF16_LOSS_RTOL)
    want, got = _flat(exact["grads"]), _flat(bf16["grads"])
    error = float((got - want).norm() / want.norm())
    assert error <= BF16_GRAD_RTOL
    assert error > AUTOCAST_SEEN  # the step really ran in bf16
    assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) >= 0.995


@needs_bf16
def test_bf16_log_probs_stay_within_the_probe_bound() -> None:
    tok = reference._tokenizer()
    model = reference._model(tok).float()
    trainer = Trainer(model, tok, reference.config("dapo"), add_special_tokens=False)
    rows, _ = trainer._batcher.rows(reference.groups(tok))
    batch = trainer._batcher.collate(rows, torch.device("cpu"))
    with torch.no_grad():
        exact, _ = token_logprobs(model, batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low, _ = token_logprobs(model, batch)
    where = batch.comp_mask.bool()
    delta = (low - exact)[where].abs()
    assert float(delta.mean()) <= BF16_LOGP_ATOL
    assert float(delta.max()) > 0
    assert low.dtype == torch.float32  # log-probs and the loss stay float32


def test_bf16_is_refused_on_a_cpu_without_bf16_instructions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(logprobs_module, "CPUINFO", cpuinfo)
    tok = reference._tokenizer()
    model = reference._model(tok).float()
    cpuinfo.write_text("flags\t\t: fpu sse avx2 avx512f avx512bw\n")
    with pytest.raises(ConfigError, match="avx512_bf16"):
        Trainer(model, tok, TrainerConfig(bf16=True))
    Trainer(model, tok, TrainerConfig())  # float32 runs anywhere
    for flag in ("avx512_bf16", "amx_bf16"):
        cpuinfo.write_text(f"flags\t\t: fpu avx512f {flag}\n")
        assert Trainer(model, tok, TrainerConfig(bf16=True)).config.bf16
    cpuinfo.unlink()  # no /proc/cpuinfo: no bf16
    with pytest.raises(ConfigError, match=r"trainer\.bf16"):
        Trainer(model, tok, TrainerConfig(bf16=True))


def test_auto_turns_the_fast_paths_on_for_a_large_model_where_bf16_is_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sapo_async.policy.grpo import trainer as trainer_module

    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(logprobs_module, "CPUINFO", cpuinfo)
    tok = reference._tokenizer()
    model = reference._model(tok).float()
    params = sum(p.numel() for p in model.parameters())
    for flags, large, want_bf16 in [
        ("avx512f avx512_bf16", False, False),  # the tiny model: the padded float32 step
        ("avx512f avx512_bf16", True, True),
        ("avx512f amx_bf16", True, True),
        ("avx512f avx2", True, False),  # no bf16 instructions: auto is off, not refused
    ]:
        cpuinfo.write_text(f"flags\t\t: fpu {flags}\n")
        floor = params if large else params + 1
        monkeypatch.setattr(trainer_module, "FAST_PATH_MIN_PARAMS", floor)
        trainer = Trainer(model, tok, TrainerConfig())
        assert (trainer.bf16, trainer.share_prompts) == (want_bf16, large), flags
        # an explicit setting wins over auto either way
        explicit = Trainer(model, tok, TrainerConfig(bf16=False, share_prompts=not large))
        assert (explicit.bf16, explicit.share_prompts) == (False, not large)
