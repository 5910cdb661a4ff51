"""Record the call signatures the vLLM fake mirrors, read from a vLLM source tree with ast.

Not a test. Run once per pinned vLLM version, on an unpacked wheel (no import of vLLM,
which needs a GPU)::

    pip download --no-deps vllm==0.33.0 -d /tmp/w
    unzip -q /tmp/w/vllm-*.whl 'vllm/*' -d /tmp/w/src
    python tests/unit/extract_vllm_signatures.py /tmp/w/src \
        > tests/unit/data/vllm_0_33_0_signatures.json

Output: ``{dotted_name: [[param, kind, default_repr_or_null], ...]}`` where kind is
``POSITIONAL_OR_KEYWORD``, ``KEYWORD_ONLY``, ``VAR_POSITIONAL`` or ``VAR_KEYWORD``;
``self``/``cls`` are left out.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

# dotted name -> (file, class, member or None for a dataclass/struct's fields)
TARGETS = {
    "vllm.LLM.__init__": ("vllm/entrypoints/llm.py", "LLM", "__init__"),
    "vllm.LLM.generate": ("vllm/entrypoints/llm.py", "LLM", "generate"),
    "vllm.LLM.get_tokenizer": ("vllm/entrypoints/llm.py", "LLM", "get_tokenizer"),
    "vllm.LLM.sleep": ("vllm/entrypoints/llm.py", "LLM", "sleep"),
    "vllm.LLM.wake_up": ("vllm/entrypoints/llm.py", "LLM", "wake_up"),
    "vllm.LLM.reset_prefix_cache": ("vllm/entrypoints/llm.py", "LLM", "reset_prefix_cache"),
    "vllm.LLM.init_weight_transfer_engine": (
        "vllm/entrypoints/rl/offline.py",
        "RLOfflineMixin",
        "init_weight_transfer_engine",
    ),
    "vllm.LLM.start_weight_update": (
        "vllm/entrypoints/rl/offline.py",
        "RLOfflineMixin",
        "start_weight_update",
    ),
    "vllm.LLM.update_weights": (
        "vllm/entrypoints/rl/offline.py",
        "RLOfflineMixin",
        "update_weights",
    ),
    "vllm.LLM.finish_weight_update": (
        "vllm/entrypoints/rl/offline.py",
        "RLOfflineMixin",
        "finish_weight_update",
    ),
    "vllm.LLM.update_weight_version": (
        "vllm/entrypoints/rl/offline.py",
        "RLOfflineMixin",
        "update_weight_version",
    ),
    "vllm.LLM.get_weight_version": (
        "vllm/entrypoints/rl/offline.py",
        "RLOfflineMixin",
        "get_weight_version",
    ),
    "vllm.SamplingParams": ("vllm/sampling_params.py", "SamplingParams", None),
    "vllm.logprobs.Logprob": ("vllm/logprobs.py", "Logprob", None),
    "vllm.outputs.CompletionOutput": ("vllm/outputs.py", "CompletionOutput", None),
    "vllm.outputs.RequestOutput.__init__": ("vllm/outputs.py", "RequestOutput", "__init__"),
    "vllm.distributed.weight_transfer.base.ParamMeta": (
        "vllm/distributed/weight_transfer/base.py",
        "ParamMeta",
        None,
    ),
    "vllm.distributed.weight_transfer.base.WeightSource.owned_names": (
        "vllm/distributed/weight_transfer/base.py",
        "WeightSource",
        "owned_names",
    ),
    "vllm.distributed.weight_transfer.base.WeightSource.iter_full": (
        "vllm/distributed/weight_transfer/base.py",
        "WeightSource",
        "iter_full",
    ),
    "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerInitInfo": (
        "vllm/distributed/weight_transfer/ipc_engine.py",
        "IPCTrainerInitInfo",
        None,
    ),
    "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.__init__": (
        "vllm/distributed/weight_transfer/ipc_engine.py",
        "IPCTrainerWeightTransferEngine",
        "__init__",
    ),
    "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.trainer_init": (
        "vllm/distributed/weight_transfer/ipc_engine.py",
        "IPCTrainerWeightTransferEngine",
        "trainer_init",
    ),
    "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.send_weights": (
        "vllm/distributed/weight_transfer/ipc_engine.py",
        "IPCTrainerWeightTransferEngine",
        "send_weights",
    ),
}

# Names used as defaults in the source, resolved by hand (checked against the source).
CONSTANTS = {"DEFAULT_PACKED_BUFFER_SIZE_BYTES": repr(1024 * 1024 * 1024)}

# Fields a dataclass inherits (ast sees one class body at a time).
INHERITED_FIELDS = {
    # TrainerInitInfo: rank: int = field(kw_only=True)
    "IPCTrainerInitInfo": [["rank", "KEYWORD_ONLY", None]],
}


def _default(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    text = ast.unparse(node)
    if text in CONSTANTS:
        return CONSTANTS[text]
    return repr(ast.literal_eval(node))


def _function(fn: ast.FunctionDef) -> list[list[str | None]]:
    a = fn.args
    out: list[list[str | None]] = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(positional, defaults, strict=True):
        out.append([arg.arg, "POSITIONAL_OR_KEYWORD", _default(d)])
    if a.vararg:
        out.append([a.vararg.arg, "VAR_POSITIONAL", None])
    for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append([arg.arg, "KEYWORD_ONLY", _default(d)])
    if a.kwarg:
        out.append([a.kwarg.arg, "VAR_KEYWORD", None])
    if out and out[0][0] in ("self", "cls"):
        out = out[1:]
    return out


def _fields(cls: ast.ClassDef) -> list[list[str | None]]:
    positional: list[list[str | None]] = []
    keyword: list[list[str | None]] = []
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        name = stmt.target.id
        if name.startswith("_") or "ClassVar" in ast.unparse(stmt.annotation):
            continue
        value, kw_only = stmt.value, False
        if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
            kws = {k.arg: k.value for k in value.keywords}
            kw_only = "kw_only" in kws and ast.literal_eval(kws["kw_only"]) is True
            if "default_factory" in kws:
                continue  # none of the mirrored fields use one
            value = kws.get("default")
            entry = [name, "KEYWORD_ONLY" if kw_only else "POSITIONAL_OR_KEYWORD", _default(value)]
        elif isinstance(value, ast.expr):
            try:
                entry = [name, "POSITIONAL_OR_KEYWORD", _default(value)]
            except ValueError:
                entry = [name, "POSITIONAL_OR_KEYWORD", ast.unparse(value)]
        else:
            entry = [name, "POSITIONAL_OR_KEYWORD", None]
        (keyword if kw_only else positional).append(entry)
    return positional + keyword + INHERITED_FIELDS.get(cls.name, [])


def extract(root: Path) -> dict[str, list[list[str | None]]]:
    out = {}
    for dotted, (file, cls_name, member) in TARGETS.items():
        tree = ast.parse((root / file).read_text())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
        if member is None:
            out[dotted] = _fields(cls)
        else:
            fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == member)
            out[dotted] = _function(fn)
    return out


if __name__ == "__main__":
    json.dump(extract(Path(sys.argv[1])), sys.stdout, indent=1)
    sys.stdout.write("\n")
