"""Least squares shared by the fits: the deterministic multi-start driver (:func:`multi_start_lsq`)
and the settings of the step-time fits (compute and communication models)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

#: Bounds of the fitted exponent (when free; the lower end is ComputeParams' own limit) and of the
#: smooth-max sharpness k and gamma.
EXPONENT_BOUNDS: tuple[float, float] = (0.25, 1.5)
K_BOUNDS: tuple[float, float] = (1.0, 32.0)
GAMMA_BOUNDS: tuple[float, float] = (1.0, 32.0)
#: Scale of the soft_l1 loss on log residuals: residuals beyond ~5 % count linearly, not squared.
LOSS_SCALE = 0.05


def multi_start_lsq(
    residuals: Callable[[np.ndarray], np.ndarray], starts: Iterable[Any], **options: Any
) -> Any:
    """Deterministic multi-start least squares: ``scipy.optimize.least_squares(residuals, x0,
    **options)`` from each initial guess of ``starts`` in turn, keeping the lowest cost (a later
    start must beat the best by more than 1e-12, so near-ties keep the earlier one).

    Returns the best ``OptimizeResult``."""
    from scipy.optimize import least_squares

    best = None
    for x0 in starts:
        res = least_squares(residuals, x0, **options)
        if best is None or res.cost < best.cost - 1e-12:
            best = res
    if best is None:
        raise ValueError("multi_start_lsq needs at least one initial guess")
    return best
