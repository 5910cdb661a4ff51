"""The vLLM fake must accept only calls the real vLLM 0.33.0 accepts, with the same meaning.

Two checks of the same rule: against signatures recorded from the vllm==0.33.0 wheel's
source (always runs), and against the installed vLLM itself (runs wherever vLLM imports).

The rule, per mirrored callable: every parameter the fake declares exists in the real one
with the same default; a positional parameter sits at the same position; a keyword-only
parameter in the fake may be keyword-only or positional-or-keyword in the real one; every
required real parameter is declared by the fake; ``**kwargs`` only where the real has it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from sapo_async.policy.generation.vllm_backend import VLLM_PINNED_VERSION
from tests.unit import fake_vllm

RECORDED = Path(__file__).parent / "data" / "vllm_0_33_0_signatures.json"

Param = tuple[str, str, str | None]  # name, kind, repr(default) or None when required


def _params(obj: Any) -> list[Param]:
    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append((p.name, p.kind.name, default))
    return out


def _mismatches(fake: list[Param], real: list[Param]) -> list[str]:
    problems = []
    real_by_name = {name: (i, kind, default) for i, (name, kind, default) in enumerate(real)}
    for i, (name, kind, default) in enumerate(fake):
        if kind == "VAR_KEYWORD":
            if not any(k == "VAR_KEYWORD" for _, k, _ in real):
                problems.append("fake takes **kwargs, real does not")
            continue
        if name not in real_by_name:
            problems.append(f"{name!r} is not a parameter of the real one")
            continue
        r_index, r_kind, r_default = real_by_name[name]
        if kind == "POSITIONAL_OR_KEYWORD" and (r_kind != kind or r_index != i):
            problems.append(f"{name!r} is positional #{i} in the fake, {r_kind} #{r_index} in real")
        if kind == "KEYWORD_ONLY" and r_kind not in ("KEYWORD_ONLY", "POSITIONAL_OR_KEYWORD"):
            problems.append(f"{name!r} cannot be passed by keyword to the real one")
        if default != r_default:
            problems.append(f"{name!r} defaults to {default} in the fake, {r_default} in real")
    declared = {name for name, _, _ in fake}
    for name, kind, default in real:
        if (
            default is None
            and kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")
            and name not in declared
        ):
            problems.append(f"real requires {name!r}, the fake does not declare it")
    return problems


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_recorded_signatures_cover_every_mirrored_callable() -> None:
    recorded = json.loads(RECORDED.read_text())
    assert {real for _, real in fake_vllm.MIRRORED.values()} == set(recorded)
    assert fake_vllm.VERSION == VLLM_PINNED_VERSION


@pytest.mark.parametrize("key", sorted(fake_vllm.MIRRORED))
def test_fake_matches_signatures_recorded_from_the_pinned_wheel(key: str) -> None:
    fake_obj, real_path = fake_vllm.MIRRORED[key]
    recorded = json.loads(RECORDED.read_text())[real_path]
    real = [(name, kind, default) for name, kind, default in recorded]
    assert _mismatches(_params(fake_obj), real) == []


def test_the_rule_catches_a_wrong_default_and_an_unknown_parameter() -> None:
    def real(level: int = 1, mode: str = "abort") -> None: ...

    def fake(level: int = 2, *, flavour: str = "x") -> None: ...

    problems = _mismatches(_params(fake), _params(real))
    assert any("'level' defaults" in p for p in problems)
    assert any("'flavour'" in p for p in problems)


_VLLM_MISSING = importlib.util.find_spec("vllm") is None


@pytest.mark.skipif(
    _VLLM_MISSING,
    reason="vLLM is not installed here (GPU-only wheel > 300 MB); the recorded-signature "
    "test above covers the pinned version",
)
@pytest.mark.parametrize("key", sorted(fake_vllm.MIRRORED))
def test_fake_matches_the_installed_vllm(key: str) -> None:
    import vllm

    assert vllm.__version__ == VLLM_PINNED_VERSION, "re-record the signatures for this version"
    fake_obj, real_path = fake_vllm.MIRRORED[key]
    assert _mismatches(_params(fake_obj), _params(_resolve(real_path))) == []
