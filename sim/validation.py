"""Input checks shared by the simulator's specs: fail early, name the field and the allowed range."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np


def check_range(
    field: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` if it lies in the interval, else raise ``ValueError`` naming ``field``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{field} must be a number, got {value!r}") from None
    if math.isnan(v):
        raise ValueError(f"{field} must be a number, got NaN")
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        lb = "(" if low_open or low is None else "["
        hb = ")" if high_open or high is None else "]"
        raise ValueError(f"{field} must be in {lb}{lo}, {hi}{hb}, got {value!r}")
    return v


def check_positive(field: str, value: float) -> float:
    return check_range(field, value, 0.0, None, low_open=True)


def check_probability(field: str, value: float) -> float:
    return check_range(field, value, 0.0, 1.0)


def check_int(field: str, value: int, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise TypeError(f"{field} must be an integer, got {value!r}")
    check_range(field, value, low, high)
    return int(value)


def check_choice(field: str, value: str, allowed: Iterable[str]) -> str:
    allowed = sorted(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {field} {value!r}; choose one of {allowed}")
    return value


def check_min_max(field_min: str, vmin: float, field_max: str, vmax: float) -> None:
    if vmin > vmax:
        raise ValueError(f"{field_min} ({vmin!r}) must not exceed {field_max} ({vmax!r})")
