"""Imports run downwards only: sim <- dynamix_gym <- adapters <- experiments (docs/ARCHITECTURE.md).
Every import statement counts, the ones inside functions too."""

from __future__ import annotations

import ast

import pytest
from support import ROOT

LAYERS = ["sim", "dynamix_gym", "adapters", "experiments"]


def _imported_packages(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_no_layer_imports_a_higher_one(layer):
    higher = set(LAYERS[LAYERS.index(layer) + 1 :])
    found = {
        str(p.relative_to(ROOT)): sorted(_imported_packages(p) & higher)
        for p in sorted((ROOT / layer).rglob("*.py"))
        if _imported_packages(p) & higher
    }
    assert not found, f"{layer} imports a higher layer: {found}"
