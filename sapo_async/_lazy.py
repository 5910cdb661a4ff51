"""Lazy package facades: a package names what it exports, and imports it on first use.

Owns one helper, :func:`lazy_exports`, that builds a package's module ``__getattr__`` and
``__dir__`` from a table ``{public name: "module.path"}``. Importing the package then costs
nothing beyond the table; ``package.Name`` imports ``module.path`` once and caches
``Name`` in the package's namespace. This is what keeps ``import sapo_async.wire`` free of
torch, transformers, web3 and nats, and ``sapo-async --help`` fast (PEP 562).

Deliberately does not know any package's contents. Type checkers read the
``TYPE_CHECKING`` imports each facade keeps beside its table.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build ``(__getattr__, __dir__)`` for ``package`` from ``{name: module}``.

    Args:
        package: the package's ``__name__`` (its namespace receives each loaded name).
        table: public name -> absolute module that defines it, or ``"module:attr"`` when
            the name is an alias of ``attr``.

    Returns:
        The two module-level hooks to assign in the package.
    """

    def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562 names the hook
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = target.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:  # noqa: N807 - PEP 562 names the hook
        return sorted(set(table) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
