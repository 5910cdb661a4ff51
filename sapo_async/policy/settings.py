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

import re
from collections.abc import Collection
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sapo_async.errors import ConfigError

__all__ = ["Settings", "settings_error"]


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
        head = re.match(r"\w+", message)
        if not loc and head is not None and head.group() in fields:
            first = first or f"{part}.{head.group()}"
        name = ".".join(str(p) for p in (part, *loc) if p != "")
        first = first or name
        value = error.get("input")
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        items.append(f"{name}{shown}: {message}")
    return ConfigError("; ".join(items), field=first or part)


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

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in cls.renamed.items():
                if old in data:
                    raise ValueError(f"{old} is now called {new}")
        return data

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise settings_error(exc, type(self).part, type(self).model_fields) from exc

    def replace(self, **changes: Any) -> Self:
        """A validated copy with ``changes``.

        Raises:
            ConfigError: an unknown field or a bad value (named).
        """
        return type(self)(**{**self.as_fields(), **changes})

    def as_fields(self) -> dict[str, Any]:
        """Every field's value, nested models kept as they are (not dumped to dicts)."""
        return {name: getattr(self, name) for name in type(self).model_fields}
