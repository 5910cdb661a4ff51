"""The base of node.toml's section models: strictness, and lists the environment may give.

Owns :class:`Section` (unknown keys, inf and nan refused; frozen), :data:`StrList` and
:func:`split_list` for the sections in :mod:`.config_sections` and :mod:`.config_network`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict
from pydantic_settings import NoDecode

__all__ = ["Section", "StrList", "spec_default", "split_list"]


def split_list(value: Any) -> Any:
    """Accept a JSON list or a comma-separated string where a list of strings is expected."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list: {exc}") from exc
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def spec_default(kind: Any, name: str) -> Any:
    """The default of a node spec dataclass's field, so a section that names the same
    setting (``[tasks] regime`` is ``PolicySpec.regime``) shares its one default."""
    return {f.name: f.default for f in dataclasses.fields(kind)}[name]


StrList = Annotated[list[str], NoDecode]
"""A list of strings that the environment may give as ``a,b`` or ``["a","b"]``."""


class Section(BaseModel):
    # allow_inf_nan: no setting means anything at inf or nan (temperature = inf samples
    # uniformly at random; lr = nan poisons the weights on the first step).
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )
