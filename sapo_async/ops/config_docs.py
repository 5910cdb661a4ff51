"""The settings' documentation, written from the fields themselves.

Owns :func:`render_example` (the commented ``node.toml`` that ``sapo-async init`` writes)
and :func:`render_reference` (the Markdown tables docs/volunteer.md embeds). Both read each
field's default and description from :mod:`.config_sections`, so nothing is written twice.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic.fields import FieldInfo

from sapo_async.ops.config_sections import SECTIONS

__all__ = ["render_example", "render_reference"]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _allowed(info: FieldInfo) -> str:
    annotation = info.annotation
    if typing.get_origin(annotation) in {typing.Union, types.UnionType}:
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    if typing.get_origin(annotation) is Literal:
        return " One of: " + ", ".join(_toml_value(arg) for arg in typing.get_args(annotation))
    return ""


def render_example() -> str:
    """Return a commented ``node.toml`` listing every setting with its default.

    Settings without a default value appear commented out. Loading the result gives the
    defaults (tested), so the file is a safe starting point.
    """
    out = [
        "# sapo-async node configuration (written by `sapo-async init`).",
        "# Every setting below shows its default; delete what you do not change.",
        "# Any setting can be overridden by an environment variable",
        "# SAPO_<SECTION>__<FIELD>, e.g. SAPO_TRAINING__LR=1e-5 or",
        "# SAPO_NATS__URLS=nats://a:4222,nats://b:4222.",
        "",
    ]
    for section_name, model in SECTIONS.items():
        out.append(f"[{section_name}]")
        heading = (model.__doc__ or "").strip().splitlines()[0]
        out.append(f"# {heading.split(': ', 1)[-1]}")
        defaults = model()
        for name, info in model.model_fields.items():
            out.append(f"# {info.description}{_allowed(info)}")
            value = getattr(defaults, name)
            if value is None:
                out.append(f"# {name} =")
            else:
                out.append(f"{name} = {_toml_value(value if name != 'data_dir' else '~/.sapo')}")
        out.append("")
    return "\n".join(out)


def render_reference() -> str:
    """Return the settings reference as Markdown tables, one per section.

    docs/volunteer.md embeds this text verbatim (a test keeps the two in sync).
    """
    out: list[str] = []
    for section_name, model in SECTIONS.items():
        out += [f"#### [{section_name}]", "", "| setting | default | meaning |", "|---|---|---|"]
        defaults = model()
        for name, info in model.model_fields.items():
            value = "~/.sapo" if name == "data_dir" else getattr(defaults, name)
            shown = "unset" if value is None else _toml_value(value)
            meaning = f"{info.description}{_allowed(info)}".replace("|", "/")
            out.append(f"| `{name}` | `{shown}` | {meaning} |")
        out.append("")
    return "\n".join(out)
