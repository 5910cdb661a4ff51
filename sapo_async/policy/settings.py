"""The base of every typed settings model: the node spec's parts, the trainer's config and
node.toml's sections are the same pydantic models, so each setting is defined once.

Owns :class:`Settings` (frozen; unknown fields, inf and nan refused) and the translation of
pydantic's errors into one :class:`~sapo_async.errors.ConfigError` that names the field as
``<part>.<field>`` (``training.questions_per_round``) and what is allowed.

Lives in :mod:`sapo_async.policy` because :class:`~sapo_async.policy.grpo.config.TrainerConfig`,
the lowest model built on it, does; :mod:`sapo_async.node` and :mod:`sapo_async.ops` sit
above. Deliberately does not know files or the environment (:mod:`sapo_async.ops.config`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    model_validator,
)
from pydantic_settings import NoDecode

from sapo_async.errors import ConfigError

__all__ = [
    "ReadableFile",
    "Settings",
    "StrList",
    "check_host_port",
    "existing_file",
    "refuse_old_names",
    "renamed_message",
    "settings_error",
    "split_list",
]


def settings_error(exc: ValidationError, part: str, fields: Collection[str] = ()) -> ConfigError:
    """One line naming every bad field of ``part``, its value and what is allowed.

    A check across fields has no location of its own: its message starts with the field
    it is about (``local + external must be ...``), and that field is named.
    """
    items = []
    first: str | None = None
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        loc = tuple(error["loc"])
        head = re.match(r"\w+(\.\w+)?", message)
        if not loc and head is not None and head.group().split(".")[0] in fields:
            first = first or ".".join(p for p in (part, head.group()) if p)
        name = ".".join(str(p) for p in (part, *loc) if p != "")
        first = first or name
        value = error.get("input")
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        items.append(f"{name}{shown}: {message}" if name else message)
    return ConfigError("; ".join(items), field=first or part)


def renamed_message(old: str, new: str) -> str:
    """What an old setting name is refused with: ``x is now called y`` (``new`` may add a
    hint after the name: ``start (seconds back)``)."""
    return f"{old} is now called {new}"


def refuse_old_names(
    data: Any,
    renamed: dict[str, str],
    *,
    advice: bool = False,
    retired: dict[str, str] | None = None,
) -> Any:
    """``data`` as it is, or ValueError naming the first old name it uses and the new one
    (with ``advice``, what to do in a file: rename the key, or move it to its section), or
    the first retired name and why it went (``retired``: name -> why)."""
    if isinstance(data, dict):
        for old, why in (retired or {}).items():
            if old in data:
                raise ValueError(f"{old} is no longer a setting ({why}): delete the key")
        for old, new in renamed.items():
            if old in data:
                message = renamed_message(old, new)
                if advice:
                    message += ": move the key" if new.startswith("[") else ": rename the key"
                raise ValueError(message)
    return data


class Settings(BaseModel):
    """A frozen settings model; constructing a bad one raises :class:`ConfigError`."""

    # allow_inf_nan: no setting means anything at inf or nan (temperature = inf samples
    # uniformly at random; lr = nan poisons the weights on the first step).
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,
        arbitrary_types_allowed=True,
    )

    part: ClassVar[str] = ""
    """The name errors put before a field's (``training``, ``defence``, ``trainer``)."""

    renamed: ClassVar[dict[str, str]] = {}
    """Old field names and their new ones: an old one is refused naming the new."""

    retired: ClassVar[dict[str, str]] = {}
    """Removed field names and why they went: one is refused saying so."""

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return refuse_old_names(data, cls.renamed, retired=cls.retired)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise settings_error(exc, type(self).part, type(self).model_fields) from exc

    def replace(self, **changes: Any) -> Self:
        """A validated copy with ``changes`` (a field never set keeps being unset, so a check
        that reads what was asked for, such as probation needing a share, sees the same).

        Raises:
            ConfigError: an unknown field or a bad value (named).
        """
        kept = {name: getattr(self, name) for name in self.model_fields_set}
        return type(self)(**{**kept, **changes})

    def as_fields(self) -> dict[str, Any]:
        """Every field's value, nested models kept as they are (not dumped to dicts)."""
        return {name: getattr(self, name) for name in type(self).model_fields}


# Value checks that pydantic's bounds cannot say, for fields of any settings model (carried
# in the field's annotation, so a node.toml section generated from a spec checks the same).
# Each raises ValueError naming the value and what is wrong.


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


def existing_file(value: Path | None) -> Path | None:
    """``value`` expanded, when it names a readable file (or is unset)."""
    if value is None:
        return None
    path = value.expanduser()
    if not path.is_file():
        raise ValueError(f"no such file: {str(path)!r}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{str(path)!r} is not readable by this user")
    return path


def check_host_port(url: str) -> None:
    """Raise ValueError when ``url`` has no host or a port outside 1..65535."""
    for one in url.split(","):
        parts = urlsplit(one.strip())
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{one!r} has a port outside 1..65535 or not a number") from None
        if not parts.hostname:
            raise ValueError(f"{one!r} names no host")
        if port == 0:
            raise ValueError(f"{one!r} has port 0; ports are 1..65535")


StrList = Annotated[list[str], NoDecode, BeforeValidator(split_list)]
"""A list of strings that the environment may give as ``a,b`` or ``["a","b"]``."""

ReadableFile = Annotated[Path | None, AfterValidator(existing_file)]
"""An optional path that must name a readable file (expanded: ``~`` works)."""
