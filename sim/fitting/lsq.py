"""Least-squares settings shared by the step-time fits (compute and communication models)."""

from __future__ import annotations

#: Bounds of the fitted exponent (when free; the lower end is ComputeParams' own limit) and of the
#: smooth-max sharpness k and gamma.
EXPONENT_BOUNDS: tuple[float, float] = (0.25, 1.5)
K_BOUNDS: tuple[float, float] = (1.0, 32.0)
GAMMA_BOUNDS: tuple[float, float] = (1.0, 32.0)
#: Scale of the soft_l1 loss on log residuals: residuals beyond ~5 % count linearly, not squared.
LOSS_SCALE = 0.05
