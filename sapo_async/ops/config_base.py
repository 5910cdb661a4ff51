"""The base of node.toml's section models: strictness, old names, and sections generated
from the node spec's own models.

Owns :class:`Section` (unknown keys, inf and nan refused; frozen; old key names refused
naming the new one), :class:`SpecSection` and :func:`spec_section` (a section whose keys are
fields of a spec part, copied with their types, defaults, bounds, checks and descriptions,
so nothing is written twice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, create_model, model_validator

from sapo_async.errors import ConfigError
from sapo_async.policy.settings import Settings, refuse_old_names

__all__ = ["Section", "SpecSection", "spec_section"]


class Section(BaseModel):
    # allow_inf_nan: no setting means anything at inf or nan (temperature = inf samples
    # uniformly at random; lr = nan poisons the weights on the first step).
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )

    renamed: ClassVar[dict[str, str]] = {}
    """Old keys of this section and where they went: an old one is refused naming the new."""

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return refuse_old_names(data, cls.renamed, advice=True)


class SpecSection(Section):
    """A section whose spec fields (:attr:`spec_fields`) are a spec part's, same names.

    Building the part (:meth:`to_part`) runs the part's own checks across fields, at load
    time, so a bad combination is named in the file's terms before any node starts.
    """

    spec_kind: ClassVar[type[Settings]]
    spec_fields: ClassVar[tuple[str, ...]] = ()

    if TYPE_CHECKING:  # the spec fields are added by spec_section, which mypy cannot see

        def __getattr__(self, name: str) -> Any: ...

    def spec_values(self) -> dict[str, Any]:
        """The values of this section's spec fields, by the spec's names."""
        return {name: getattr(self, name) for name in self.spec_fields}

    def to_part(self, **derived: Any) -> Any:
        """The spec part these settings give, with ``derived`` fields (paths, choices)."""
        return self.spec_kind(**self.spec_values(), **derived)

    @model_validator(mode="after")
    def _part_checks(self) -> Self:
        try:
            self.to_part()
        except ConfigError as exc:
            part = self.spec_kind.part
            raise ValueError(str(exc).removeprefix(f"{part}: ") if part else str(exc)) from exc
        return self


def spec_section(
    name: str, base: type[SpecSection], *also: tuple[type[Settings], tuple[str, ...]]
) -> type[SpecSection]:
    """A section model: ``base`` (its own file-only fields and checks, its ``spec_kind`` and
    ``spec_fields``) plus those fields of the spec and any ``also`` (model, fields) pairs,
    copied (annotation with its checks, default, bounds, description)."""
    copied: dict[str, Any] = {}
    for spec, fields in ((base.spec_kind, base.spec_fields), *also):
        for field in fields:
            copied[field] = (spec.model_fields[field].annotation, spec.model_fields[field])
    section: type[SpecSection] = create_model(
        name, __base__=base, __module__=base.__module__, __doc__=base.__doc__, **copied
    )
    return section
