"""The convergence model fitted to training runs under batch schedules (the schedule-fidelity check).

Static-batch curves cannot tell how a *change* of batch acts on progress and on the attainable
accuracy; runs whose batch changes mid-training (``python -m experiments.schedules``) can. This
module replays a measured run's batch sequence through :class:`~sim.convergence.ConvergenceModel`
exactly as the engine advances it (the midpoint progress step of :func:`sim.scaling.advance`, the
batch memory updated over each interval's progress, accuracy at the interval's end) and fits the
parameters that govern schedules to the measured validation accuracy:

    acc_ceiling           the plateau of a run at (or below) the reference batch
    shape scale           progress to the plateau (multiplies ``shape_x``)
    none_exponent         the gain of a larger batch without learning-rate scaling
    gap_per_doubling      accuracy lost per doubling of the remembered batch above ``ref_batch``
    stretch_exponent      progress slow-down per doubling of the remembered batch
    batch_memory_progress how fast a new batch's effect on the attainable accuracy sets in
    lr_stable_gain        the learning-rate multiplier beyond which a rule that raises the
                          learning rate (AdaScale) loses progress (:func:`sim.scaling.lr_stability`)
    lr_unstable_exponent  how fast it loses it beyond there
    noise scale factor    a multiplier on the profile's gradient-noise scale (hence on AdaScale's
                          gain and on the cap of every rule's gain): the calibration estimated it
                          from static runs on another day, and the schedules see its effect directly

by bounded least squares (:func:`sim.fitting.lsq.multi_start_lsq`) on the log of the error rate
(:func:`log_error_residuals`) over every interval of every run.
The shape of the gradient-noise curve over progress stays as the profile's curves fitted it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.convergence import ConvergenceModel, ConvergenceParams
from sim.fitting.lsq import multi_start_lsq

#: The fitted parameters, in the order of the solver's vector, with their bounds.
FIT_PARAMETERS: tuple[str, ...] = (
    "acc_ceiling",
    "shape_scale",
    "none_exponent",
    "gap_per_doubling",
    "stretch_exponent",
    "log_batch_memory_progress",
    "log_lr_stable_gain",
    "lr_unstable_exponent",
    "log_noise_scale_factor",
)

#: ``lr_stable_gain`` at the upper bound of its search: no limit within any batch of the runs.
NO_LR_LIMIT = 1e3


@dataclass(frozen=True)
class ScheduleRun:
    """One measured run: its global batch and validation accuracy at the end of every interval."""

    name: str
    regime: str  # learning-rate rule (sim.scaling.LR_RULES)
    seed: int
    iterations: int  # K, optimiser steps per interval
    global_batch: np.ndarray
    val_accuracy: np.ndarray

    def __post_init__(self) -> None:
        if len(self.global_batch) != len(self.val_accuracy) or len(self.global_batch) < 1:
            raise ValueError(
                f"run {self.name} seed {self.seed}: needs >= 1 interval, with one batch and one accuracy each"
            )
        if self.iterations < 1:
            raise ValueError(f"run {self.name}: iterations must be >= 1, got {self.iterations}")


def replay(model: ConvergenceModel, run: ScheduleRun) -> np.ndarray:
    """The model's validation accuracy (noise-free) at the end of each of ``run``'s intervals (both
    counters of a :attr:`~sim.convergence.ConvergenceModel.split_noise` model advanced as the engine does)."""
    progress, noise_progress, memory, out = 0.0, 0.0, None, []
    for gb in run.global_batch.astype(float):
        if memory is None:
            memory = model.initial_batch_memory(gb)
        dp, dq = model.advance(gb, progress, noise_progress, run.iterations)
        memory = model.update_batch_memory(memory, gb, dp)
        progress += dp
        noise_progress += dq
        out.append(model.accuracy(progress, memory))
    return np.asarray(out)


def with_vector(params: ConvergenceParams, x: Sequence[float]) -> ConvergenceParams:
    ceiling, scale, none_e, gap, stretch, log_mem, log_gs, q, log_noise = (float(v) for v in x)
    gs = math.exp(log_gs)
    return replace(
        params,
        acc_ceiling=ceiling,
        shape_x=tuple(float(v) * scale for v in params.shape_x),
        none_exponent=none_e,
        gap_per_doubling=gap,
        stretch_exponent=stretch,
        batch_memory_progress=math.exp(log_mem),
        lr_stable_gain=None if gs >= NO_LR_LIMIT * (1 - 1e-9) else gs,
        lr_unstable_exponent=q,
        log_grad_var=tuple(v + log_noise for v in params.log_grad_var),
    )


def vector_of(params: ConvergenceParams) -> np.ndarray:
    """The solver's vector of ``params`` (shape and noise factors relative to ``params``: 1)."""
    gs = NO_LR_LIMIT if params.lr_stable_gain is None else min(params.lr_stable_gain, NO_LR_LIMIT)
    return np.array([params.acc_ceiling, 1.0, params.none_exponent, params.gap_per_doubling,
                     params.stretch_exponent, math.log(params.batch_memory_progress), math.log(gs),
                     params.lr_unstable_exponent, 0.0])  # fmt: skip


def bounds(params: ConvergenceParams) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of the solver's vector (:data:`FIT_PARAMETERS`)."""
    lo = np.array([params.acc_chance + 0.01, 0.2, 0.0, 0.0, 0.0, math.log(1.0), 0.0, 0.0, math.log(0.1)])
    hi = np.array([1.0, 5.0, 0.5, 0.2, 1.5, math.log(1e4), math.log(NO_LR_LIMIT), 4.0, math.log(30.0)])
    return lo, hi


def at_bounds(fit: ScheduleFit, tol: float = 1e-3) -> list[str]:
    """The fitted parameters that ended on a bound (the data push past what the model allows)."""
    lo, hi = bounds(fit.before)
    x = vector_of(fit.params)
    x[1] = fit.params.shape_x[-1] / fit.before.shape_x[-1]
    x[-1] = fit.params.log_grad_var[0] - fit.before.log_grad_var[0]
    span = hi - lo
    return [f"{n} at its {'upper' if abs(v - h) <= tol * w else 'lower'} bound"
            for n, v, l_, h, w in zip(FIT_PARAMETERS, x, lo, hi, span, strict=True)
            if abs(v - l_) <= tol * w or abs(v - h) <= tol * w]  # fmt: skip


def residuals(params: ConvergenceParams, runs: Sequence[ScheduleRun]) -> np.ndarray:
    """Model minus measured validation accuracy over every interval of every run."""
    models = {r: ConvergenceModel(params, r) for r in sorted({run.regime for run in runs})}
    return np.concatenate([replay(models[run.regime], run) - run.val_accuracy for run in runs])


#: Error rates below this are held at it in :func:`log_error_residuals` (a run at 100 % accuracy).
ERROR_FLOOR = 1e-3


def log_error_residuals(params: ConvergenceParams, runs: Sequence[ScheduleRun]) -> np.ndarray:
    """log(1 - model accuracy) minus log(1 - measured accuracy) over every interval of every run:
    the residual the fit minimises. In accuracy a run's early rise outweighs its approach to the
    plateau, where the time to a target near the plateau is decided (one accuracy point at 93 %
    is a seventh of the remaining error, at 60 % a fortieth); the log of the error rate weighs a
    relative error alike anywhere on the curve."""
    models = {r: ConvergenceModel(params, r) for r in sorted({run.regime for run in runs})}
    return np.concatenate([
        np.log(np.maximum(1.0 - replay(models[run.regime], run), ERROR_FLOOR))
        - np.log(np.maximum(1.0 - run.val_accuracy, ERROR_FLOOR))
        for run in runs
    ])  # fmt: skip


def rmse(params: ConvergenceParams, runs: Sequence[ScheduleRun]) -> float:
    return float(np.sqrt(np.mean(residuals(params, runs) ** 2))) if runs else math.nan


@dataclass(frozen=True)
class ScheduleFit:
    params: ConvergenceParams
    before: ConvergenceParams
    rmse_before: float
    rmse_after: float
    runs: int
    points: int


def fit_schedules(params: ConvergenceParams, runs: Sequence[ScheduleRun]) -> ScheduleFit:
    """Fit :data:`FIT_PARAMETERS` of ``params`` to ``runs`` (both regimes at once) by
    :func:`log_error_residuals`; deterministic (fixed starts: the profile's own values and four
    neutral guesses)."""
    if not runs:
        raise ValueError("fit_schedules needs at least one run")
    lo, hi = bounds(params)
    x0 = np.clip(vector_of(params), lo + 1e-9, hi - 1e-9)
    top = float(np.max([r.val_accuracy.max() for r in runs]))
    starts = [x0]
    # Neutral guesses: no learning-rate limit and one at twice the base rate (the limit's cost is
    # flat in it beyond the largest gain of the runs, so a start there cannot find a limit), each
    # at a smaller and at the profile's noise scale.
    for log_gs in (math.log(NO_LR_LIMIT), math.log(2.0)):
        for log_noise in (math.log(0.3), 0.0):
            starts.append(np.clip(np.array([top, 1.0, 0.25, 0.01, 0.2, math.log(50.0), log_gs, 1.0, log_noise]),
                                  lo + 1e-9, hi - 1e-9))  # fmt: skip
    res = multi_start_lsq(lambda x: log_error_residuals(with_vector(params, x), runs), starts,
                          bounds=(lo, hi), x_scale=hi - lo)  # fmt: skip
    fitted = with_vector(params, res.x)
    fitted = replace(fitted, fit_rmse=rmse(fitted, runs))
    return ScheduleFit(fitted, params, rmse(params, runs), fitted.fit_rmse, len(runs),
                       int(sum(len(r.val_accuracy) for r in runs)))  # fmt: skip
