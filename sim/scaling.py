"""Batch scaling: statistical efficiency, AdaScale's gain, the learning-rate rules and the
midpoint progress step. The one home of these formulas (the simulator, the controllers, the
profiling code and the real backend's learning rate all call them); numpy-free and scipy-free, so
a worker process imports it at no cost.

With global batch ``M``, base batch ``M0`` and gradient noise scale ``B`` (McCandlish's B_simple):

    E(M)     = (B + M0) / (B + M)                   # statistical efficiency, in (0, 1] for M >= M0
    r_ada(M) = (M / M0) * E(M)                      # AdaScale's gain (Pollux), in [1, M / M0]

Learning-rate rules (:data:`LR_RULES`), as the multiplier of the base learning rate
(:func:`lr_gain`) and as progress per step in base-batch steps (:func:`progress_gain`):

    rule       lr / lr0             progress per step
    adascale   r_ada                r_ada
    linear     M / M0               r_ada                       (= min(M / M0, r_ada))
    sqrt       sqrt(M / M0)         min(sqrt(M / M0), r_ada)
    none       1                    min((M / M0) ** none_exponent, r_ada)

Before the first noise-scale estimate AdaScale's learning-rate gain is taken as 1 (the base
learning rate, the conservative end of its range).

A learning rate far above the base one trains worse than the rules' gain says (real AdaScale runs
at 8-16x the base batch on the CPU task: slower than no scaling at all, and one seed in four
diverged; ``results/fidelity/schedules_fit.md``). :func:`lr_stability` is that loss as a factor on
the progress per step of a rule whose learning rate is ``g`` times the base one:

    S(g) = 1                      for g <= g_s       (g_s = ``stable_gain``; None: no limit)
    S(g) = (g_s / g) ** q         for g >  g_s       (q = ``unstable_exponent``)

so that with q = 1 a rule's gain saturates at g_s and with q > 1 it falls beyond it. The rule
``none`` never raises the learning rate (g = 1), so S = 1 for it.

:func:`advance` is the midpoint rule over ``n`` steps at a fixed batch:
``dp = n * r(p + n r(p) / 2)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

LR_RULES = ("adascale", "linear", "sqrt", "none")


def statistical_efficiency(noise_scale, global_batch, base_batch):
    """E(M) = (B_noise + M0) / (B_noise + M): progress per sample at batch M relative to M0
    (floats or numpy arrays)."""
    return (noise_scale + base_batch) / (noise_scale + global_batch)


def adascale_gain(global_batch, base_batch, noise_scale):
    """r_ada = (M / M0) * E(M): base-batch steps of progress in one step at ``M`` (floats or arrays)."""
    return global_batch / base_batch * statistical_efficiency(noise_scale, global_batch, base_batch)


def estimated_adascale_gain(global_batch: float, base_batch: float, noise_scale: float | None) -> float:
    """:func:`adascale_gain` at an estimated noise scale (clipped at 0); 1 before the first estimate."""
    if noise_scale is None:
        return 1.0
    return adascale_gain(global_batch, base_batch, max(float(noise_scale), 0.0))


def lr_stability(lr_multiplier, stable_gain: float | None, unstable_exponent: float = 1.0):
    """S(g): the progress factor of a learning rate ``lr_multiplier`` (g) times the base one (floats
    or numpy arrays); 1 when ``stable_gain`` is None or g <= ``stable_gain``."""
    if stable_gain is None:
        return 1.0
    if isinstance(lr_multiplier, int | float):  # the simulator's per-step path: no numpy
        return 1.0 if lr_multiplier <= stable_gain else (stable_gain / lr_multiplier) ** unstable_exponent
    import numpy as np  # arrays (fits and analysis)

    g = np.maximum(np.asarray(lr_multiplier, dtype=float), stable_gain)
    out = (stable_gain / g) ** unstable_exponent
    return float(out) if out.ndim == 0 else out


def progress_gain(
    rule: str,
    global_batch: float,
    base_batch: float,
    noise_scale: float,
    none_exponent: float,
    stable_gain: float | None = None,
    unstable_exponent: float = 1.0,
    max_gain: float | None = None,
    lr_scale: float = 1.0,
    lr_noise_scale: float | None = None,
):
    """Base-batch steps advanced by one optimiser step under ``rule`` (scalars), times
    :func:`lr_stability` of the rule's learning-rate multiplier.

    ``noise_scale`` is the noise that sets a batch's benefit to progress; ``lr_noise_scale`` (None:
    the same) is the one AdaScale's estimator reports and sets its learning rate by. When they
    differ (a convergence model's ``progress_noise_factor``), ``adascale`` advances ``r_ada`` at the
    progress noise with the learning rate of ``r_ada`` at the reported one, and a guard's cap on that
    rate scales the progress by the fraction of the rate it keeps.

    ``max_gain`` and ``lr_scale`` are the guards' cap on that multiplier and their back-off factor
    (``sim.guards``): the multiplier becomes ``min(g, max_gain) * lr_scale`` and a step advances at
    most that many base steps (a rate below the rule's is progress lost, as the sqrt rule's is);
    under ``none`` only the back-off applies. At their defaults nothing changes."""
    scale = global_batch / base_batch
    r_ada = adascale_gain(global_batch, base_batch, noise_scale)
    if rule == "none":
        return min(scale**none_exponent, r_ada) * lr_scale
    if rule == "sqrt":
        r, g = min(math.sqrt(scale), r_ada), math.sqrt(scale)
    elif rule == "adascale":
        r = r_ada
        g = r_ada if lr_noise_scale is None else adascale_gain(global_batch, base_batch, lr_noise_scale)
    else:
        r, g = r_ada, scale
    if max_gain is not None or lr_scale != 1.0:
        capped = (g if max_gain is None else min(g, max_gain)) * lr_scale
        r = min(r, capped) if r == g or rule != "adascale" else r * min(1.0, capped / g)
        g = capped
    if stable_gain is None:
        return r
    return r * lr_stability(g, stable_gain, unstable_exponent)


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
    return estimated_adascale_gain(global_batch, base_batch, noise_scale)


def advance(per_step: Callable[[float, float], float], batch: float, progress: float, steps: float) -> float:
    """Progress gained over ``steps`` steps at ``batch`` from ``progress`` (midpoint rule), with
    ``per_step(batch, progress)`` the progress of one step."""
    r1 = per_step(batch, progress)
    return steps * per_step(batch, progress + 0.5 * steps * r1)
