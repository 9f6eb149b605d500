"""Files of the simulator: loading the fitted-parameter files shipped in ``sim/data`` (written by the
fitting scripts), atomic writes, and the one JSON dumper (:func:`dump_json`, :func:`jsonable`)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from sim.validation import check_choice

T = TypeVar("T")

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: files written here get ordinary permissions (mkstemp makes 0600)


def atomic_write(path: str | Path, write: Callable[[IO], Any], mode: str = "w") -> Path:
    """Write through ``write(fh)`` to a temporary file beside ``path``, fsync it, then rename it
    over ``path``: a reader, or a crash, sees the old file or the new one, never half of one.
    Text modes write UTF-8 with ``\\n`` line ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    text = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
    try:
        with os.fdopen(fd, mode, **text) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write` of a string."""
    return atomic_write(path, lambda fh: fh.write(text))


def jsonable(value: Any, digits: int | None = None, zero_below: float = 0.0) -> Any:
    """Plain JSON: NaN / inf -> None, numpy scalars and arrays -> Python, tuples -> lists, paths ->
    strings, dataclasses -> dicts, keys -> strings. With ``digits``, finite floats are rounded to
    that many significant digits, and those with ``|x| < zero_below`` written as 0."""
    if isinstance(value, float | np.floating):
        v = float(value)
        if not math.isfinite(v):
            return None
        if digits is None:
            return v
        return 0.0 if abs(v) < zero_below else float(f"{v:.{digits}g}")
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), digits, zero_below)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, digits, zero_below) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, digits, zero_below) for v in value]
    if isinstance(value, Path):
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value), digits, zero_below)
    return value


def dump_json(doc: Any, digits: int | None = None, zero_below: float = 0.0) -> str:
    """``doc`` as indented JSON with sorted keys and a final newline (see :func:`jsonable`)."""
    return json.dumps(jsonable(doc, digits, zero_below), indent=2, sort_keys=True, allow_nan=False) + "\n"


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
