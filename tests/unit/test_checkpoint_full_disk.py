"""A checkpoint write that fails (full disk, torch, safetensors, OS) is translated at the
checkpoint code, leaves the directory as it was, and says what to do (issue 55, item 4).

The seam-level tests inject each failure and run everywhere; the tmpfs tests fill a real
disk, and need root to mount one (CI runs as root)."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import SafetensorError

from sapo_async.errors import CheckpointError
from sapo_async.node import checkpoint, checkpoint_disk
from sapo_async.node.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from sapo_async.node.checkpoint_disk import checkpoint_bytes
from tests.fixtures.disk import SmallTmpfs

ENOSPC_SAFETENSORS = "Error while serializing: I/O error: No space left on device (os error 28)"


def _trained(width: int = 256) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and an AdamW that took one step (so the optimizer holds its moments):
    about 0.8 MB of checkpoint at the default width."""
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, width)).sum().backward()
    optimizer.step()
    return model, optimizer


def _save(directory: Path, model: Any, optimizer: Any, round_: int) -> Path:
    return save_checkpoint(
        directory, model=model, optimizer=optimizer, round_=round_, policy_version=round_
    )


def _listing(directory: Path) -> dict[str, list[str]]:
    return {
        str(p.relative_to(directory)): sorted(c.name for c in p.iterdir())
        for p in [directory, *directory.iterdir()]
        if p.is_dir()
    }


def _fail_with(exc: BaseException) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        for arg in args:  # leave a partial file behind, as a real full disk does
            if isinstance(arg, str) and arg.endswith(".safetensors"):
                Path(arg).write_bytes(b"\0" * 1000)
        raise exc

    return fail


# Each way a write can fail, at the call that fails: safetensors' own error (what a full
# disk raises today), the OS's, torch's, and a failure after the rename (LATEST).
FAILURES = {
    "safetensors-model": ("save_model", SafetensorError(ENOSPC_SAFETENSORS)),
    "safetensors-optimizer": ("save_file", SafetensorError(ENOSPC_SAFETENSORS)),
    "os-fsync": ("_fsync", OSError(errno.ENOSPC, "No space left on device")),
    "torch": ("save_model", RuntimeError("[enforce fail at inline_container.cc:672]")),
    "latest-pointer": ("os.replace", OSError(errno.ENOSPC, "No space left on device")),
}


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_write_is_translated_and_leaves_the_directory_as_it_was(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Today a SafetensorError escaped the checkpoint code (it caught OSError only), and
    # every failure left its partial .round-* directory on the disk.
    model, optimizer = _trained()
    ck = tmp_path / "ck"
    _save(ck, model, optimizer, 1)
    before = _listing(ck)
    target, exc = FAILURES[case]
    if target == "os.replace":
        monkeypatch.setattr(checkpoint.os, "replace", _fail_with(exc))
    else:
        monkeypatch.setattr(checkpoint, target, _fail_with(exc))
    with pytest.raises(CheckpointError) as caught:
        _save(ck, model, optimizer, 2)
    message = str(caught.value)
    assert "\n" not in message
    assert str(ck) in message
    assert "round-00000002" in message
    monkeypatch.undo()
    assert _listing(ck) == before  # no partial directory, LATEST unchanged
    assert load_checkpoint(ck, model=model, optimizer=optimizer).round == 1


def test_a_full_disk_names_the_directory_the_space_free_and_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer = _trained()
    ck = tmp_path / "ck"
    needed = checkpoint_bytes(model, optimizer)
    assert 3 * (256 * 256 + 256) * 4 < needed < 1 << 20  # weights and two AdamW moments
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint, "save_model", _fail_with(SafetensorError(ENOSPC_SAFETENSORS)))
    monkeypatch.setattr(
        checkpoint_disk.shutil, "disk_usage", lambda _: usage._replace(free=300 * 1024)
    )
    with pytest.raises(CheckpointError) as caught:
        _save(ck, model, optimizer, 2)
    message = str(caught.value)
    assert f"disk holding {ck} is full" in message
    assert "300.0 KiB free" in message
    assert f"needs about {needed / 1024:.1f} KiB" in message
    assert "Free space there (at least" in message  # what to do
    assert not has_checkpoint(ck)
    assert list(ck.iterdir()) == []


def test_a_torch_error_on_a_disk_without_room_is_reported_as_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's own writer says "unexpected pos", not ENOSPC: the free space tells.
    model, optimizer = _trained()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint, "save_file", _fail_with(RuntimeError("unexpected pos 704")))
    monkeypatch.setattr(checkpoint_disk.shutil, "disk_usage", lambda _: usage._replace(free=4096))
    with pytest.raises(CheckpointError, match="is full"):
        _save(tmp_path / "ck", model, optimizer, 1)


def test_a_write_that_fails_for_another_reason_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer = _trained()
    monkeypatch.setattr(
        checkpoint, "save_file", _fail_with(OSError(errno.EIO, "Input/output error"))
    )
    with pytest.raises(CheckpointError) as caught:
        _save(tmp_path / "ck", model, optimizer, 1)
    message = str(caught.value)
    assert "is full" not in message
    assert "Input/output error" in message
    assert list((tmp_path / "ck").iterdir()) == []


def test_partial_checkpoints_a_killed_writer_left_are_removed_at_the_next_save(
    tmp_path: Path,
) -> None:
    # A process killed mid-write leaves .round-*; nothing removed them before.
    model, optimizer = _trained()
    ck = tmp_path / "ck"
    _save(ck, model, optimizer, 1)
    stale = ck / ".round-00000002-k1ll3d"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 4096)
    (ck / ".LATEST.tmp").write_text("round-0000")
    _save(ck, model, optimizer, 2)
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "round-00000001", "round-00000002"]


def test_a_second_writer_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    # The lock that makes removing a killed writer's partials safe: held by one writer at
    # a time (a second open of the directory stands in for another process).
    model, optimizer = _trained()
    ck = tmp_path / "ck"
    _save(ck, model, optimizer, 1)
    fd = os.open(ck, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(
            CheckpointError, match=f"another process is writing checkpoints in {ck}"
        ):
            _save(ck, model, optimizer, 2)
    finally:
        os.close(fd)
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "round-00000001"]
    _save(ck, model, optimizer, 2)


def test_a_loaded_checkpoint_keeps_no_file_mapped(tmp_path: Path) -> None:
    # The optimizer state came back as tensors mapped from optimizer.safetensors and AdamW
    # updates them in place: the file stayed mapped for the life of the process, so once
    # the rotation deleted that checkpoint its space was not freed (and its disk could not
    # be unmounted).
    model, optimizer = _trained()
    ck = tmp_path / "ck"
    _save(ck, model, optimizer, 1)
    load_checkpoint(ck, model=model, optimizer=optimizer)
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps (not Linux) to list the process's mapped files")
    assert str(ck) not in maps.read_text()


# --- a real full disk ---------------------------------------------------------------------


def test_a_real_full_disk_fails_in_one_line_and_leaves_the_previous_checkpoint(
    small_tmpfs: SmallTmpfs,
) -> None:
    model, optimizer = _trained()
    needed = checkpoint_bytes(model, optimizer)
    # Room for one checkpoint (about 0.8 MB), not two.
    disk = small_tmpfs(1 << 20, covered_by="the seam-level tests in this file cover the same code")
    ck = disk / "checkpoints"
    _save(ck, model, optimizer, 1)
    used = shutil.disk_usage(disk).used
    with pytest.raises(CheckpointError) as caught:
        _save(ck, model, optimizer, 2)
    message = str(caught.value)
    assert "\n" not in message
    assert f"disk holding {ck} is full" in message
    assert f"needs about {needed / 1024:.1f} KiB" in message
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "round-00000001"]
    assert shutil.disk_usage(disk).used == used  # nothing partial left on the full disk
    assert load_checkpoint(ck, model=model, optimizer=optimizer).round == 1
