"""Checkpoints: model, optimizer, round, policy version and RNG states, written atomically.

Layout of a checkpoint directory::

    <dir>/LATEST                      name of the newest complete checkpoint
    <dir>/round-00000042/model.safetensors
    <dir>/round-00000042/optimizer.safetensors   every tensor of the optimizer state
    <dir>/round-00000042/manifest.json           round, version, param groups, scalar
                                                 optimizer state, Python/NumPy RNG, digests

A checkpoint is written into a temporary sibling directory, fsynced, renamed into place,
and only then named in ``LATEST`` (``os.replace``), so a crash leaves either the previous
checkpoint or the new one, never a torn one; the loader re-checks file digests anyway.
No pickle anywhere: tensors go to safetensors, everything else to JSON.

Deliberately does not know what a round does. Resuming restores everything the next round
depends on: with the round-keyed seeds of :mod:`sapo_async.node.learner`, a resumed node's next
round equals an uninterrupted run's (tested).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from sapo_async.errors import CheckpointError

__all__ = ["FORMAT_VERSION", "CheckpointState", "load_checkpoint", "save_checkpoint"]

FORMAT_VERSION = 1
_LATEST = "LATEST"


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What a loaded checkpoint said besides tensors.

    Attributes:
        round: the next round to run.
        policy_version: optimizer steps taken.
        path: the checkpoint's directory.
        extra: caller data saved with it.
    """

    round: int
    policy_version: int
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _optimizer_split(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], Any]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    version, state, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    meta = {
        "python": [version, list(state), gauss],
        "numpy": [
            str(np_state[0]),
            np.asarray(np_state[1]).tolist(),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
    }
    return tensors, meta


def save_checkpoint(
    directory: Path,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    round_: int,
    policy_version: int,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint of round ``round_`` into ``directory`` and point LATEST at it.

    Args:
        directory: the checkpoint directory (created).
        model: the module whose ``state_dict`` is saved (tied weights handled).
        optimizer: its optimizer.
        round_: the next round to run after resuming.
        policy_version: optimizer steps taken.
        extra: small JSON-serialisable caller data.
        keep: how many newest checkpoints to keep (older ones are deleted).

    Returns:
        The new checkpoint's directory.

    Raises:
        CheckpointError: the write failed (disk full, permissions, unserialisable extra).
    """
    directory = Path(directory)
    name = f"round-{round_:08d}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory))
        save_model(model, str(tmp / "model.safetensors"))
        opt_tensors, opt_meta = _optimizer_split(optimizer)
        rng_tensors, rng_meta = _rng_state()
        save_file({**opt_tensors, **rng_tensors}, str(tmp / "optimizer.safetensors"))
        manifest = {
            "format": FORMAT_VERSION,
            "round": round_,
            "policy_version": policy_version,
            "created_at": time.time(),
            "optimizer": opt_meta,
            "rng": rng_meta,
            "extra": extra or {},
            "files": {f: _sha256(tmp / f) for f in ("model.safetensors", "optimizer.safetensors")},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
        for f in tmp.iterdir():
            _fsync(f)
        final = directory / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        latest_tmp = directory / f".{_LATEST}.tmp"
        latest_tmp.write_text(name)
        _fsync(latest_tmp)
        os.replace(latest_tmp, directory / _LATEST)
    except (OSError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"writing checkpoint {name} in {directory} failed: {exc}") from exc
    olds = sorted(p for p in directory.glob("round-*") if p.is_dir() and p.name != name)
    for old in olds[: max(0, len(olds) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    if torch.cuda.is_available():
        states = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
        if states:
            torch.cuda.set_rng_state_all(states)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    kind, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def load_checkpoint(
    directory: Path, *, model: Any, optimizer: torch.optim.Optimizer | None = None
) -> CheckpointState:
    """Load the checkpoint LATEST names into ``model`` (and ``optimizer``), restoring RNGs.

    Raises:
        CheckpointError: no checkpoint, a digest mismatch (torn or altered files), another
            format version, or tensors that do not fit the model or optimizer.
    """
    directory = Path(directory)
    latest = directory / _LATEST
    if not latest.is_file():
        raise CheckpointError(f"no checkpoint in {directory} (no {_LATEST} file)")
    path = directory / latest.read_text().strip()
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} has no readable manifest: {exc}") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format {manifest.get('format')}")
    for f, digest in manifest["files"].items():
        if not (path / f).is_file() or _sha256(path / f) != digest:
            raise CheckpointError(f"checkpoint file {path / f} is missing or torn")
    try:
        load_model(model, str(path / "model.safetensors"), strict=True)
        tensors = load_file(str(path / "optimizer.safetensors"))
        if optimizer is not None:
            meta = manifest["optimizer"]
            state: dict[int, dict[str, Any]] = {}
            for key, value in tensors.items():
                if key.startswith("state."):
                    _, idx, name = key.split(".", 2)
                    state.setdefault(int(idx), {})[name] = value
            for idx, scalars in meta["scalars"].items():
                state.setdefault(int(idx), {}).update(scalars)
            optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        _restore_rng(tensors, manifest["rng"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit: {exc}") from exc
    return CheckpointState(
        round=int(manifest["round"]),
        policy_version=int(manifest["policy_version"]),
        path=path,
        extra=manifest.get("extra", {}),
    )
