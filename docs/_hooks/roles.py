"""A griffe extension for the API reference: the docstrings' Sphinx roles
(``:class:`Journal```, ``:func:`~contextfold.render```) become Markdown code spans.

The package's docstrings are read in editors and ``help()`` too, where the roles are the
familiar spelling; mkdocstrings renders Markdown, in which they would show as raw text.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["SphinxRoles", "plain_roles"]

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const):`(~?)\.?([^`]+)`")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by a code span of its target
    (only the last dotted part when the target starts with ``~``, as Sphinx shows it)."""
    return _ROLE.sub(_shown, text)


class SphinxRoles(griffe.Extension):
    """Rewrites each loaded object's docstring with :func:`plain_roles`."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
