"""Markdown building blocks every report renders with: table rows, sections, bullet lists, the
"name value %" lists of per-type figures, and the command line that regenerates a report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def row(cells: Sequence[Any]) -> str:
    """One table row; an empty cell renders as ``| |``."""
    return "|" + "|".join(f" {c} " if str(c) != "" else " " for c in cells) + "|"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """A markdown table: the header, its rule, one line per row. ``align``: one letter per column
    (``l`` left, ``r`` right; rule ``| --- | ---: |``); None: the compact rule ``|---|---|``."""
    rule = (
        "|" + "---|" * len(header) if align is None else row(["---:" if c == "r" else "---" for c in align])
    )
    return [row(header), rule, *(row(r) for r in rows)]


def section(title: str, *blocks: Sequence[str], level: int = 2) -> list[str]:
    """``## title``, a blank line, then the blocks (lists of lines) one after another."""
    out = ["#" * level + " " + title, ""]
    for b in blocks:
        out += list(b)
    return out


def blocks(parts: Iterable[Sequence[str]]) -> list[str]:
    """The non-empty parts (lists of lines), a blank line between two."""
    out: list[str] = []
    for part in parts:
        if part:
            out += [""] * bool(out) + list(part)
    return out


def bullets(items: Iterable[str], empty: str | None = None) -> list[str]:
    """``- item`` lines; ``empty``'s line when there are none (and ``empty`` is given)."""
    out = [f"- {x}" for x in items]
    return out or ([f"- {empty}"] if empty else [])


def percents(values: Mapping[Any, float], digits: int = 1, unit: str = " %") -> str:
    """``"a 1.2 %, b 3.4 %"`` of fractions."""
    return ", ".join(f"{k} {100 * v:.{digits}f}{unit}" for k, v in values.items())


def met(ok: bool) -> str:
    return "(met)" if ok else "(missed)"


def render(lines: Iterable[str]) -> str:
    return "\n".join(lines) + "\n"


def overrides_text(exclude: Sequence[str] = ()) -> str:
    """The Hydra command-line overrides of this run (`` key=value`` each), less the ``exclude`` keys;
    empty outside a Hydra app."""
    try:
        from hydra.core.hydra_config import HydraConfig

        over = list(HydraConfig.get().overrides.task)
    except ValueError:
        return ""
    return "".join(f" {o}" for o in over if o.split("=")[0].lstrip("+~") not in exclude)
