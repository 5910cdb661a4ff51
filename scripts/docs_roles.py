"""A griffe extension for the API reference (`just docs`, mkdocs.yml).

The docstrings cross-reference with Sphinx roles (``:class:`~sapo_async.node.spec.NodeSpec```),
which read well in source and in ``help()`` but show as raw text in Markdown. This turns
each role into inline code of its target (the last dotted part when the target starts
with ``~``, as Sphinx shows it), and leaves the docstrings themselves alone.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match[2]
    return f"`{target.rsplit('.', 1)[-1] if match[1] else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_code, obj.docstring.value)
