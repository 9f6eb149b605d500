"""Loading the fitted-parameter files shipped in ``sim/data`` (written by the fitting scripts)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sim.validation import check_choice

T = TypeVar("T")


def data_path(name: str) -> Path:
    """Path of a file shipped in ``sim/data``."""
    return Path(str(resources.files("sim") / "data" / name))


@cache
def load_json(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def load_param_table(cls: type[T], path: str | Path, keys: tuple[str, ...]) -> dict[tuple, T]:
    """Rows of ``doc["models"]`` as frozen dataclasses keyed by the ``keys`` fields.

    Extra columns in the file (fit diagnostics written for people) are ignored.
    """
    doc = load_json(str(path))
    fields = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    table = {}
    for row in doc["models"]:
        obj = cls(**{k: v for k, v in row.items() if k in fields})
        table[tuple(getattr(obj, k) for k in keys)] = obj
    return table


def lookup_pair(table: dict[tuple, T], gpu: str, app: str, what: str) -> T:
    """``table[(gpu, app)]`` with an error naming the known GPU types and applications."""
    check_choice(f"gpu type (in {what})", gpu, {g for g, _ in table})
    check_choice(f"application for {gpu} (in {what})", app, {a for g, a in table if g == gpu})
    return table[(gpu, app)]
