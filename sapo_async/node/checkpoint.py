"""Checkpoints: model, optimizer, round, policy version and RNG states, written atomically.

Layout of a checkpoint directory::

    <dir>/LATEST                      name of the newest complete checkpoint
    <dir>/round-00000042/model.safetensors
    <dir>/round-00000042/optimizer.safetensors   every tensor of the optimizer state
    <dir>/round-00000042/manifest.json           round, version, param groups, scalar
                                                 optimizer state, Python/NumPy RNG, digests

A checkpoint is written into a temporary sibling directory (``.round-…-*``), fsynced,
renamed into place, and only then named in ``LATEST`` (``os.replace``), so a crash leaves
either the previous checkpoint or the new one, never a torn one; the loader re-checks file
digests anyway. No pickle anywhere: tensors go to safetensors, everything else to JSON.

A write that fails (a full disk above all: safetensors, torch and the OS each say so their
own way) raises one :class:`~sapo_async.errors.CheckpointError` and leaves the directory as
it was: the temporary directory (or a renamed one LATEST does not yet name) is removed, and
on a full disk the message names the directory, the space free and the space the checkpoint
needs (:func:`checkpoint_bytes`). A writer holds an exclusive ``flock`` on the directory
(another writer there is refused), so a ``.round-*`` it finds was left by a writer killed
mid-write: it removes them before writing (on a file system without ``flock`` it leaves
them alone). The kernel releases the lock of a killed process. That disk side (the space
estimate, the lock, removing partials, the failure's message) lives in
:mod:`sapo_async.node.checkpoint_disk`; this module writes, rotates and loads.

Damage (a flipped byte, a truncated file, a missing manifest) is found by the digests
before anything is loaded. The loader then falls back to the newest older checkpoint that
checks out, and moves each damaged one aside as ``<dir>/damaged-round-…`` (out of the
rotation, so nothing later deletes or overwrites it) for the volunteer to inspect or
delete; with no good checkpoint left it raises, naming the paths and what to do.

Deliberately does not know what a round does. Resuming restores everything the next round
depends on: with the round-keyed seeds of :mod:`sapo_async.node.learner`, a resumed node's next
round equals an uninterrupted run's (tested).
"""

from __future__ import annotations

import dataclasses
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
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from sapo_async.errors import CheckpointError
from sapo_async.node.checkpoint_disk import (
    WRITE_ERRORS,
    checkpoint_bytes,
    remove_partial,
    removed,
    sole_writer,
    write_failure,
)

__all__ = [
    "FORMAT_VERSION",
    "CheckpointState",
    "DamagedCheckpoint",
    "checkpoint_bytes",
    "has_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "state_bytes",
]

FORMAT_VERSION = 1
_LATEST = "LATEST"
_FILES = ("model.safetensors", "optimizer.safetensors")
"""What every checkpoint holds besides its manifest, each listed there with its digest."""
_TMP_GLOB = ".round-*"
"""The temporary directories checkpoints are written into (``.<name>-<random>``)."""
_LATEST_TMP = f".{_LATEST}.tmp"
"""The new LATEST pointer until it replaces the old one."""


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """What a loaded checkpoint said besides tensors.

    Attributes:
        round: the next round to run.
        policy_version: optimizer steps taken.
        path: the checkpoint's directory.
        extra: caller data saved with it.
        damaged: newer checkpoints that were damaged and skipped (moved aside).
    """

    round: int
    policy_version: int
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)
    damaged: tuple[DamagedCheckpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class DamagedCheckpoint:
    """A checkpoint the loader skipped.

    Attributes:
        path: where it was.
        reason: what was wrong with it.
        kept_as: where it was moved (``damaged-<name>`` beside it).
    """

    path: Path
    reason: str
    kept_as: Path


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
        CheckpointError: the write failed (disk full, permissions, unserialisable extra);
            nothing of it is left in ``directory``, and on a full disk the message names
            the space free and needed.
    """
    directory = Path(directory)
    name = f"round-{round_:08d}"
    created: list[Path] = []  # what this write put in directory, to remove if it fails
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with sole_writer(directory) as alone:
            if alone:
                remove_partial(directory, temp_dirs=_TMP_GLOB, temp_file=_LATEST_TMP)
            final = _write(
                directory,
                name,
                created,
                model=model,
                optimizer=optimizer,
                round_=round_,
                policy_version=policy_version,
                extra=extra,
            )
            olds = sorted(p for p in directory.glob("round-*") if p.is_dir() and p.name != name)
            for old in olds[: max(0, len(olds) - (keep - 1))]:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        left = [p for p in created if not removed(p)]
        if not isinstance(exc, WRITE_ERRORS):
            raise
        raise CheckpointError(
            write_failure(directory, name, exc, left, model=model, optimizer=optimizer)
        ) from exc
    return final


def _write(
    directory: Path,
    name: str,
    created: list[Path],
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    round_: int,
    policy_version: int,
    extra: dict[str, Any] | None,
) -> Path:
    """The write itself; appends each path it creates to ``created`` as it goes."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory))
    created.append(tmp)
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
        "files": {f: _sha256(tmp / f) for f in _FILES},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    for f in tmp.iterdir():
        _fsync(f)
    final = directory / name
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    created[-1] = final  # complete, but not the checkpoint until LATEST names it
    latest_tmp = directory / _LATEST_TMP
    created.append(latest_tmp)
    latest_tmp.write_text(name)
    _fsync(latest_tmp)
    os.replace(latest_tmp, directory / _LATEST)
    created.clear()
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


class _Damaged(Exception):
    """A checkpoint's files do not check out (internal: the loader falls back)."""


def _verified_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` once every file matches its digest.

    Raises:
        _Damaged: missing directory or manifest, unreadable manifest, a manifest that does
            not list a digest for every file the loader reads (nothing to check it against:
            a torn file would reach the loader), or a file that is missing or torn.
        CheckpointError: another format version (not damage: an older release wrote it).
    """
    try:
        loaded = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise _Damaged(f"no readable manifest ({exc})") from exc
    files = loaded.get("files") if isinstance(loaded, dict) else None
    if not isinstance(files, dict):
        raise _Damaged("no readable manifest (no map of files and digests)")
    manifest: dict[str, Any] = loaded
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format {manifest.get('format')}, this release reads "
            f"{FORMAT_VERSION}: run the release that wrote it, or move {path.parent} aside "
            "to start from round 0"
        )
    for f in _FILES:
        if not isinstance(files.get(f), str):
            raise _Damaged(f"the manifest lists no digest for {f} (cannot check it)")
    for f, digest in files.items():
        try:
            ok = _sha256(path / f) == digest
        except OSError:
            ok = False
        if not ok:
            raise _Damaged(f"file {f} is missing or torn (its digest does not match)")
    return manifest


def _move_aside(path: Path) -> Path:
    target = path.with_name(f"damaged-{path.name}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"damaged-{path.name}-{n}")
    os.rename(path, target)
    return target


def has_checkpoint(directory: Path) -> bool:
    """Whether ``directory`` holds a checkpoint to resume from (a LATEST pointer, or a
    checkpoint directory when the pointer itself was lost)."""
    directory = Path(directory)
    return (directory / _LATEST).is_file() or any(p.is_dir() for p in directory.glob("round-*"))


def load_checkpoint(
    directory: Path, *, model: Any, optimizer: torch.optim.Optimizer | None = None
) -> CheckpointState:
    """Load the checkpoint LATEST names into ``model`` (and ``optimizer``), restoring RNGs.

    A damaged checkpoint (torn or missing files, unreadable manifest) is skipped for the
    newest older one that checks out, and moved aside (see the module docstring); the
    returned state lists what was skipped.

    Raises:
        CheckpointError: no checkpoint, no undamaged one (the message names each and what
            to do), another format version, or tensors that do not fit the model or
            optimizer.
    """
    directory = Path(directory)
    latest = directory / _LATEST
    try:
        named = latest.read_text().strip() if latest.is_file() else ""
    except (OSError, UnicodeDecodeError):
        named = ""  # a damaged pointer: the round-* directories themselves still tell
    if named and (os.sep in named or not named.startswith("round-")):
        named = ""
    others = sorted(
        (p for p in directory.glob("round-*") if p.is_dir() and p.name != named), reverse=True
    )
    candidates = ([directory / named] if named else []) + others
    if not candidates:
        raise CheckpointError(f"no checkpoint in {directory} (no {_LATEST} file)")
    skipped: list[tuple[Path, str]] = []
    for path in candidates:
        try:
            manifest = _verified_manifest(path)
        except _Damaged as why:
            skipped.append((path, str(why)))
            continue
        state = _load_verified(path, manifest, model=model, optimizer=optimizer)
        damaged = tuple(
            DamagedCheckpoint(p, reason, _move_aside(p) if p.exists() else p)
            for p, reason in skipped
        )
        return dataclasses.replace(state, damaged=damaged)
    listed = "; ".join(f"{p}: {reason}" for p, reason in skipped)
    raise CheckpointError(
        f"no usable checkpoint in {directory}: {listed}. Nothing was changed: restore the "
        f"directory from a backup, or move it aside to start again from round 0"
    )


def _load_verified(
    path: Path,
    manifest: dict[str, Any],
    *,
    model: Any,
    optimizer: torch.optim.Optimizer | None,
) -> CheckpointState:
    try:
        load_model(model, str(path / "model.safetensors"), strict=True)
        # Copies, not views of the file's mapping: the optimizer updates its state in
        # place for the rest of the run, which would keep the file mapped (and its disk
        # space taken after the rotation deletes it).
        tensors = {k: v.clone() for k, v in load_file(str(path / "optimizer.safetensors")).items()}
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
    except (RuntimeError, ValueError, KeyError, SafetensorError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit: {exc}") from exc
    return CheckpointState(
        round=int(manifest["round"]),
        policy_version=int(manifest["policy_version"]),
        path=path,
        extra=manifest.get("extra", {}),
    )


def state_bytes(model: Any) -> int:
    """What a checkpoint of ``model`` with AdamW holds, in bytes: weights, and two moments
    per trainable parameter (tied weights counted once)."""
    params = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() * p.element_size() * (3 if p.requires_grad else 1) for p in params)
