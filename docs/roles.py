"""griffe extensions for the documentation build, so that docstrings read the same in
``help()`` and on the site: Sphinx cross-reference roles (:class:`~ebmlab.x.Y`,
:func:`f`, ...) become Markdown code spans, and overriding methods without a docstring
show their base class's."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc):`(~?)([^`]+)`")


def _span(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_span, obj.docstring.value)


class InheritedDocstrings(griffe.Extension):
    """A method that overrides a documented one without a docstring of its own (a
    sampler's ``step``, a task's ``loss``) takes the docstring of the nearest base class
    that has one, as ``help()`` does."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg)

    def _visit(self, obj: griffe.Object) -> None:
        for member in obj.members.values():
            if member.is_alias:
                continue
            if member.is_class:
                self._inherit(member)
            if member.is_module or member.is_class:
                self._visit(member)

    @staticmethod
    def _inherit(cls: griffe.Class) -> None:
        try:
            bases = cls.mro()
        except (griffe.AliasResolutionError, ValueError):
            return
        for name, member in cls.members.items():
            if member.is_alias or member.docstring is not None:
                continue
            for base in bases:
                parent = base.members.get(name)
                if parent is not None and parent.docstring is not None:
                    member.docstring = griffe.Docstring(
                        parent.docstring.value, parent=member, parser=parent.docstring.parser
                    )
                    break
