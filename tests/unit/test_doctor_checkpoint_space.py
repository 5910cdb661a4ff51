"""doctor's disk check sizes checkpoints from the newest one on disk: it warns when the
free space is below the new checkpoint plus the ones a node keeps, and fails when not even
one more fits (issue 55, item 4)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sapo_async.ops import doctor_disk
from sapo_async.ops.config import NodeConfig, load_config
from sapo_async.ops.doctor_disk import check_disk
from tests.fixtures.disk import SmallTmpfs

MiB = 1 << 20


def _cfg(data_dir: Path) -> NodeConfig:
    return load_config(node={"data_dir": str(data_dir)})


def _checkpoint(data_dir: Path, round_: int, size: int) -> Path:
    """A checkpoint directory of ``size`` bytes in the layout the node writes."""
    path = data_dir / "checkpoints" / f"round-{round_:08d}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * (size // 2))
    (path / "optimizer.safetensors").write_bytes(b"\0" * (size - size // 2 - 2))
    (path / "manifest.json").write_text("{}")
    (data_dir / "checkpoints" / "LATEST").write_text(path.name)
    return path


def _free(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, free: int) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(doctor_disk.shutil, "disk_usage", lambda _: usage._replace(free=free))


@pytest.mark.parametrize(
    ("free_mib", "status"),
    [(400, "ok"), (250, "warn"), (150, "warn"), (90, "fail")],
)
def test_doctor_sizes_checkpoints_from_the_newest_one_on_disk(
    free_mib: int, status: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 100 MiB checkpoint: a node writes the next one beside the 2 it keeps, so it wants
    # 300 MiB free; under 100 MiB its next checkpoint cannot be written at all. Before,
    # doctor knew only its fixed floor and said "ok" to each of these.
    data = tmp_path / "data"
    _checkpoint(data, 3, 50 * MiB)
    _checkpoint(data, 4, 100 * MiB)
    _free(monkeypatch, tmp_path, free_mib * MiB)
    check = check_disk(_cfg(data), min_free_bytes=0)
    assert check.status == status, check
    if status != "ok":
        assert str(data / "checkpoints" / "round-00000004") in check.detail
        assert "100.0 MiB" in check.detail
        assert "300.0 MiB" in check.detail
        assert "node.data_dir" in check.fix
    else:
        assert "3 checkpoints' worth" in check.detail


def test_doctor_without_a_checkpoint_keeps_its_fixed_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _free(monkeypatch, tmp_path, 3 << 30)
    check = check_disk(_cfg(tmp_path / "data"))
    assert check.status == "ok"
    assert "no checkpoint yet" in check.detail


def test_doctor_reads_the_newest_checkpoint_when_latest_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    _checkpoint(data, 1, 10 * MiB)
    _checkpoint(data, 2, 20 * MiB)
    (data / "checkpoints" / "LATEST").unlink()
    _free(monkeypatch, tmp_path, 30 * MiB)
    check = check_disk(_cfg(data), min_free_bytes=0)
    assert check.status == "warn"
    assert "round-00000002" in check.detail


@pytest.fixture
def small_disk(small_tmpfs: SmallTmpfs) -> Path:
    """A 4 MiB tmpfs (needs root; CI runs as root), unmounted at teardown."""
    return small_tmpfs("4m", covered_by="the seam-level tests above cover the same check")


def test_doctor_warns_on_a_real_disk_with_room_for_fewer_than_three_checkpoints(
    small_disk: Path,
) -> None:
    data = small_disk / "data"
    _checkpoint(data, 1, int(1.5 * MiB))
    cfg = _cfg(data)
    assert check_disk(cfg, min_free_bytes=0).status == "warn"  # 2.5 MiB free, 4.5 wanted
    _checkpoint(data, 2, 2 * MiB)
    check = check_disk(cfg, min_free_bytes=0)  # 0.5 MiB free: the next one cannot fit
    assert check.status == "fail", check
    assert str(small_disk) in check.detail
