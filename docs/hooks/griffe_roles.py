"""A griffe extension for the API pages: the Sphinx roles of the project's docstrings
(``:class:`~a.B```) are shown as code spans, as the reference pages show them
(:func:`docs_reference.strip_roles`)."""

from __future__ import annotations

import sys
from pathlib import Path

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_reference import strip_roles


def _strip(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = strip_roles(obj.docstring.value)


class SphinxRolesAsCode(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        """Every member of a loaded package."""
        _strip(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        """The package itself (griffe fires no ``on_object`` for it)."""
        _strip(pkg)
