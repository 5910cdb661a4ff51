"""A prepared model directory's integrity: its record, the checks against it, moving it aside.

Owns the marker file :data:`MARKER` (``sapo-packaged.json``) a preparation writes last into
a prepared directory, the record it holds (:func:`record_files`: the size and sha256 of each
file, and of each safetensors file's header), the checks of a directory against that record
(:func:`check_prepared`: fast, of sizes, safetensors headers and small files; full, of every
byte), and :func:`move_aside`, which renames a damaged directory to ``<name>.damaged-<n>``.

Guarantees:

* a directory without a marker, or whose marker does not parse, is :class:`Damaged`: the
  marker is written last and atomically (:func:`write_marker`), so its presence means the
  directory was complete when it was written;
* a check reports the first difference in one line naming the file, and changes nothing
  but the marker (only when ``update``: the full check that passed, or the digests of a
  directory prepared by an earlier release that recorded none);
* a damaged directory is renamed, never deleted, and a rename another process made first
  is not an error.

Does not know which model a directory holds, where caches live, how one is prepared or what
happens after a directory is moved aside: :mod:`.packaged` decides those (it prepares again
from the wheel).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.logs import get_logger

__all__ = ["MARKER", "Damaged", "check_prepared", "move_aside", "record_files", "write_marker"]

_log = get_logger("sapo_async.policy.models.cache_check")

#: Written last into a prepared directory: its presence means the directory was complete,
#: and it records each file's size and sha256 (``files``) and whether every byte has been
#: checked against them since the preparation (``verified``).
MARKER = "sapo-packaged.json"

#: Files other than safetensors up to this size are digested whole on every load.
_SMALL = 64 << 20


class Damaged(Exception):
    """A prepared directory that does not match its record; the message says where."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _header(path: Path, size: int) -> bytes:
    """The length prefix and JSON header of safetensors file ``path`` (of ``size`` bytes),
    checked to parse and to describe exactly the data after it.

    Raises:
        Damaged: a short file, a header that runs past the file or does not parse, or
            tensors that do not end where the file does.
    """
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise Damaged(f"{path.name}: {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if 8 + length > size:
            raise Damaged(
                f"{path.name}: its header says {length} bytes, more than the file's {size}"
            )
        raw = handle.read(length)
    try:
        header = json.loads(raw)
        ends = [
            int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"
        ]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise Damaged(f"{path.name}: its header does not parse as safetensors") from None
    data = size - 8 - length
    if max(ends, default=0) != data:
        raise Damaged(
            f"{path.name}: its header's tensors end at byte {max(ends, default=0)} of the "
            f"data, which holds {data} bytes"
        )
    return prefix + raw


def record_files(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file in ``directory`` but the marker (safetensors files:
    also the sha256 of their header, which every load checks)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.iterdir()):
        if path.name == MARKER or not path.is_file():
            continue
        size = path.stat().st_size
        entry: dict[str, Any] = {"size": size, "sha256": _sha256(path)}
        if path.suffix == ".safetensors":
            entry["header_sha256"] = hashlib.sha256(_header(path, size)).hexdigest()
        files[path.name] = entry
    return files


def _read_marker(directory: Path) -> dict[str, Any]:
    marker = directory / MARKER
    if not marker.is_file():
        raise Damaged(f"{MARKER} is missing (a preparation or a copy cut short)")
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        raise Damaged(f"{MARKER} does not parse as JSON") from None
    if not isinstance(data, dict):
        raise Damaged(f"{MARKER} is not a JSON object")
    return data


def _check_files(directory: Path, files: Any, *, full: bool) -> None:
    """Compare ``directory`` with its record ``files``: sizes, headers and small files
    always; every byte when ``full``.

    Raises:
        Damaged: the first difference, naming the file.
    """
    if not isinstance(files, dict) or not files:
        raise Damaged(f"{MARKER}: its 'files' record is not a table of files")
    for name, entry in sorted(files.items()):
        path = directory / name
        try:
            size = path.stat().st_size
            want_size, want_sha = int(entry["size"]), str(entry["sha256"])
        except FileNotFoundError:
            raise Damaged(f"{name} is missing") from None
        except (TypeError, KeyError, ValueError):
            raise Damaged(f"{MARKER}: the record of {name} is not size and sha256") from None
        if size != want_size:
            raise Damaged(f"{name}: {size} bytes, the marker recorded {want_size}")
        if "header_sha256" in entry:
            header = hashlib.sha256(_header(path, size)).hexdigest()
            if header != entry["header_sha256"]:
                raise Damaged(
                    f"{name}: its header's sha256 {header} is not the recorded "
                    f"{entry['header_sha256']}"
                )
        if full or ("header_sha256" not in entry and size <= _SMALL):
            got = _sha256(path)
            if got != want_sha:
                raise Damaged(f"{name}: sha256 {got} is not the recorded {want_sha}")


def write_marker(directory: Path, data: dict[str, Any]) -> None:
    """Write the marker atomically (a reader never sees half of it)."""
    tmp = directory / f".{MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, directory / MARKER)


def check_prepared(final: Path, *, full: bool, update: bool) -> str:
    """Check prepared directory ``final`` against its marker; returns what was checked.

    Sizes, safetensors headers and small files on every call; every byte's sha256 when
    ``full``, or when the marker says the directory is new (not yet checked whole since it
    was prepared). A directory prepared before digests were recorded is checked by its
    structure and, when ``update``, its digests are recorded now. When ``update``, a full
    check that passes is written into the marker (later loads are fast).

    Raises:
        Damaged: what is wrong, naming the file.
    """
    marker = _read_marker(final)
    if "files" not in marker:  # prepared by an earlier release: nothing recorded to compare
        weights = sorted(final.glob("*.safetensors"))
        if not weights or not (final / "config.json").is_file():
            raise Damaged("config.json or the *.safetensors weights are missing")
        for path in weights:
            _header(path, path.stat().st_size)
        if not update:
            return "sizes and headers checked (digests not recorded yet: an earlier release)"
        marker.update(files=record_files(final), verified=True, verified_at=_now())
        try:
            write_marker(final, marker)
        except OSError as exc:  # a read-only cache: checked by its structure each time
            _log.debug("model_cache_marker_unwritten", path=str(final), error=str(exc))
            return "sizes and headers checked (digests not recorded: read-only)"
        _log.info(
            "model_cache_recorded",
            path=str(final),
            note="prepared by an earlier release: its headers parse; the sha256 of each "
            "file is recorded now and checked from here on",
        )
        return "digests recorded"
    if update:  # a load: the first one after preparation reads every byte
        full = full or marker.get("verified") is not True
    _check_files(final, marker["files"], full=full)
    if full and update and marker.get("verified") is not True:
        marker.update(verified=True, verified_at=_now())
        try:
            write_marker(final, marker)
        except OSError as exc:  # a read-only cache: the full check runs again next time
            _log.debug("model_cache_marker_unwritten", path=str(final), error=str(exc))
    return "every file's sha256 checked" if full else "sizes and headers checked"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def move_aside(final: Path, problem: str) -> None:
    """Rename damaged ``final`` to ``<name>.damaged-<n>`` (kept: never deleted), saying so.

    Raises:
        ConfigError: it cannot be renamed (naming the directory and what to do).
    """
    n = 1
    while True:
        aside = final.with_name(f"{final.name}.damaged-{n}")
        if not aside.exists():
            try:
                final.rename(aside)
            except FileNotFoundError:  # another process moved it first
                return
            except OSError as exc:
                if aside.exists():  # another process took this name first
                    n += 1
                    continue
                raise ConfigError(
                    f"{final} is damaged ({problem}) and cannot be moved aside to {aside} "
                    f"({exc.strerror}): move or delete it, and it is prepared again",
                    field="model.name_or_path",
                ) from exc
            break
        n += 1
    _log.warning(
        "model_cache_damaged",
        path=str(final),
        problem=problem,
        moved_to=str(aside),
        note="preparing it again from the installed wheel; delete the damaged copy once "
        "you no longer need it",
    )
