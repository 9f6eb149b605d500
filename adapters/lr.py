"""Learning-rate scaling on batch changes: the simulator's rules (``sim.convergence.LR_RULES``).

With global batch ``M``, base batch ``M0`` and base learning rate ``lr0``:

    adascale: lr = lr0 * r_ada,  r_ada = (M / M0) * (B_noise + M0) / (B_noise + M)   # AdaScale's gain
    linear:   lr = lr0 * M / M0
    sqrt:     lr = lr0 * sqrt(M / M0)
    none:     lr = lr0

``B_noise`` is the two-batch noise-scale estimate (``dynamix_gym.stats.NoiseScaleEstimator`` over
the interval reports). Before the first estimate AdaScale's gain is taken as 1 (the base learning
rate), which is the conservative end of its range [1, M / M0].
"""

from __future__ import annotations

import math

#: The simulator's rules (``sim.convergence.LR_RULES``; a test keeps the two equal). Not imported from
#: there: worker processes would pay for scipy's import at every start.
LR_RULES = ("adascale", "linear", "sqrt", "none")


def lr_gain(rule: str, global_batch: int, base_batch: int, noise_scale: float | None) -> float:
    """Multiplier of the base learning rate for ``rule`` at ``global_batch``."""
    if rule not in LR_RULES:
        raise ValueError(f"unknown lr_rule {rule!r}; choose one of {list(LR_RULES)}")
    if global_batch <= 0 or base_batch <= 0:
        raise ValueError(f"global_batch and base_batch must be positive, got {global_batch}, {base_batch}")
    scale = global_batch / base_batch
    if rule == "linear":
        return scale
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "none":
        return 1.0
    if noise_scale is None:
        return 1.0
    b = max(float(noise_scale), 0.0)
    return scale * (b + base_batch) / (b + global_batch)
