"""What a measurement ran on, recorded beside it: :func:`environment`.

Owns the record that lets a result which does not reproduce be traced. The 4-node SmolLM2
``real_mix`` table (docs/results/paper-table-real-mix-4, seeds 0 and 1, recorded on
2026-12-03 before 10:47 UTC) was not reproduced bit for bit the next day, and the code that
made it (5b6d9e8), run again on the next day's machine, gives the next day's numbers, not
the recorded ones: what changed was the environment (this machine's virtual environment and
model cache were rebuilt at 12:35 that day), and nothing had recorded what it was before.

So every experiment run now records, in the worker that ran it:

* the packages whose arithmetic or parsing reaches a reward (:data:`PACKAGES`);
* the Python, the platform, the CPU model, how many cores and torch threads, and the kernel
  family torch dispatches to (``AVX512``, ``AVX2``, ...);
* ``numerics``: a digest of a few seeded kernels the model's forward and sampling use (fp32
  and bf16 matrix products, softmax, multinomial draws). Two machines with the same package
  versions can still round differently (another CPU takes another kernel path); this tells
  them apart without running a model;
* ``weights``: a digest of the loaded model's parameters, where the run loads one (catches a
  model cache built by another dequantiser); a swarm of two models records one per model,
  by name.

:func:`environments` compares the runs of one table: which recorded none, and what differs
between those that did. Recording only; nothing refuses to run or resume on a difference.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PACKAGES",
    "differences",
    "environment",
    "environments",
    "numerics_probe",
    "resume_note",
]

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "gguf",
    "accelerate",
    "reasoning-gym",
)
"""Distributions whose version can move a reward: the model's arithmetic (torch, numpy),
its loading (transformers, safetensors, gguf, accelerate), tokenising and the tasks and
verifiers (reasoning-gym)."""


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def numerics_probe() -> str:
    """A digest of seeded fp32 and bf16 matrix products, a softmax and multinomial draws at
    a small model's sizes (576-wide, as SmolLM2-135M), on this CPU with torch's threads as
    they are set: equal on two machines that round the same."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 576, generator=g)
    w = torch.randn(576, 1536, generator=g) / 24
    h = torch.nn.functional.silu(x @ w)
    hb = (x.bfloat16() @ w.bfloat16()).float()
    p = torch.softmax(h, dim=-1)
    drawn = torch.multinomial(p, 4, generator=g)
    digest = hashlib.sha256()
    for t in (h, hb, p, drawn):
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _weights_digest(model: Any) -> str:
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def environment(model: Any = None, *, models: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This process's environment as a run records it (see the module docstring); with
    ``model`` (a torch module), ``weights`` too; with ``models`` (a mixed swarm's, by
    name), ``weights`` by name."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "packages": {name: _version(name) for name in PACKAGES},
        "numerics": numerics_probe(),
    }
    if model is not None:
        env["weights"] = _weights_digest(model)
    if models is not None:
        env["weights"] = {name: _weights_digest(m) for name, m in models.items()}
    return env


def _flat(env: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in env.items():
        if isinstance(value, Mapping):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"key: recorded -> current"`` for every key the two environments disagree on
    (nested keys dotted: ``packages.torch``; a key one of them lacks reads ``absent``)."""
    a, b = _flat(recorded), _flat(current)
    keys = sorted(a.keys() | b.keys())
    return [
        f"{k}: {a.get(k, 'absent')} -> {b.get(k, 'absent')}"
        for k in keys
        if a.get(k, "absent") != b.get(k, "absent")
    ]


def environments(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """How the labelled runs' environments compare: ``same`` (every run recorded one and
    they agree), ``differences`` (each later environment against the first, labelled by the
    run that first shows it) and ``unrecorded`` (runs made before environments were
    recorded)."""
    unrecorded = [label for label, env in runs if not env]
    recorded = [(label, env) for label, env in runs if env]
    seen: list[Mapping[str, Any]] = []
    diffs: list[str] = []
    for label, env in recorded:
        if any(env == other for other in seen):
            continue
        if seen:
            diffs += [f"{label}: {d}" for d in differences(seen[0], env)]
        seen.append(env)
    return {
        "same": not unrecorded and len(seen) <= 1,
        "differences": diffs,
        "unrecorded": unrecorded,
    }


def _labels(labels: Sequence[str]) -> str:
    return (
        ", ".join(labels)
        if len(labels) <= 3
        else f"{', '.join(labels[:2])} and {len(labels) - 2} more"
    )


def resume_note(
    recorded: Sequence[tuple[str, Mapping[str, Any]]], *, torch_threads: int | None = None
) -> str | None:
    """One line for a resumed experiment whose recorded runs were not made in this
    environment (weights aside: this process has not loaded the model), or ``None`` when
    every recorded run's environment is this one's. ``torch_threads``: the threads the new
    runs will have, where not this process's (a worker process runs with one, and its runs
    record that): without it every run made by a worker read as made elsewhere."""
    if not recorded:
        return None
    here = environment()
    if torch_threads is not None:
        here["torch_threads"] = torch_threads
    by_change: dict[str, list[str]] = {}
    for label, env in recorded:
        if not env:
            by_change.setdefault("no environment recorded", []).append(label)
        elif diffs := differences({k: v for k, v in env.items() if k != "weights"}, here):
            by_change.setdefault("; ".join(diffs), []).append(label)
    if not by_change:
        return None
    return (
        "resuming runs made in another environment, which this one need not reproduce bit "
        "for bit (" + " | ".join(f"{_labels(v)}: {k}" for k, v in by_change.items()) + ")"
    )
