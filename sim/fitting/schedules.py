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
from pathlib import Path

import numpy as np
import pandas as pd

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


def calibration_runs(curves_csv: Path) -> list[ScheduleRun]:
    """The profile's static AdaScale calibration curves (its ``curves.csv``) as runs (every interval
    of K steps; a curve whose steps are not evenly spaced is left out); none when the file is absent."""
    if not curves_csv.exists():
        return []
    d = pd.read_csv(curves_csv)
    out = []
    for (gb, seed), g in d.groupby(["global_batch", "seed"], sort=True):
        k = np.diff(np.concatenate([[0], g["steps"].to_numpy()]))
        if len(set(k.tolist())) != 1:
            continue
        out.append(ScheduleRun(f"calibration-{gb}", "adascale", int(seed), int(k[0]),
                               np.full(len(g), float(gb)), g["val_accuracy"].to_numpy(float)))  # fmt: skip
    return out


#: A calibration curve whose validation accuracy never reached this diverged (it ends at chance).
TRAINED_PEAK = 0.5


def trained(runs: list[ScheduleRun]) -> list[ScheduleRun]:
    return [r for r in runs if r.val_accuracy.max() >= TRAINED_PEAK]


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


# --------------------------------------------------------------------------------------------
# Time to the target: the batch dependence refitted to runs whose batch changes
# --------------------------------------------------------------------------------------------

#: The parameters :func:`fit_intervals_to_target` fits, in the order of its solver's vector: the
#: shape's progress scale (multiplies ``shape_x``), the stretch exponent, the log of the batch
#: memory and the log of the progress noise factor. Together they set how the number of intervals
#: to a target depends on the batch and on a change of batch; the gradient statistics (the noise a
#: controller reads), the ceiling and the shape's form stay as the static curves fitted them.
TARGET_PARAMETERS: tuple[str, ...] = (
    "shape_scale",
    "stretch_exponent",
    "log_batch_memory_progress",
    "log_progress_noise_factor",
)
#: Intervals a replay holds the run's last batch for, past its end, to find where the model reaches
#: the target; a model that does not reach it by then counts that horizon.
HOLD_INTERVALS = 60


def crossing(accuracy: np.ndarray, target: float) -> float:
    """The interval count (fractional) at which ``accuracy`` (one value per interval end) first
    reaches ``target``: linear between the two interval ends around the crossing, 1 if the first
    interval already does; ``nan`` where it never does."""
    acc = np.asarray(accuracy, dtype=np.float64)
    hit = np.flatnonzero(acc >= target)
    if not hit.size:
        return math.nan
    i = int(hit[0])
    if i == 0:
        return 1.0
    return i + float((target - acc[i - 1]) / (acc[i] - acc[i - 1]))


def replay_many(model: ConvergenceModel, global_batch: np.ndarray, iterations: int) -> np.ndarray:
    """:func:`replay` of many runs at once: ``global_batch`` is (runs, intervals), every run with
    ``iterations`` steps per interval; the noise-free validation accuracy at each interval's end,
    (runs, intervals), equal to :func:`replay` run by run (the engine's midpoint steps of both
    counters, the batch memory over each interval's progress)."""
    gb = np.asarray(global_batch, dtype=np.float64)
    if gb.ndim != 2 or gb.shape[1] < 1:
        raise ValueError(f"replay_many needs global batches of shape (runs, intervals), got {gb.shape}")
    k = float(iterations)
    p = np.zeros(gb.shape[0])
    q = np.zeros(gb.shape[0])
    memory = np.log2(gb[:, 0])
    mem_scale = model.params.batch_memory_progress
    out = np.empty_like(gb)
    for j in range(gb.shape[1]):
        m = gb[:, j]
        if model.split_noise:  # sim.convergence.ConvergenceModel.advance
            r1 = model.progress_per_step_many(m, q, reported=True)
            dq = k * model.progress_per_step_many(m, q + 0.5 * k * r1, reported=True)
            dp = k * model.progress_per_step_many(m, q + 0.5 * dq)
        else:
            r1 = model.progress_per_step_many(m, p)
            dp = dq = k * model.progress_per_step_many(m, p + 0.5 * k * r1)
        memory = memory + (1.0 - np.exp(-dp / mem_scale)) * (np.log2(m) - memory)
        p, q = p + dp, q + dq
        out[:, j] = model.accuracy_many(p, memory)
    return out


def crossing_many(accuracy: np.ndarray, target: float) -> np.ndarray:
    """:func:`crossing` row by row of (runs, intervals) accuracies; ``inf`` where a row never reaches it."""
    acc = np.asarray(accuracy, dtype=np.float64)
    above = acc >= target
    i = np.argmax(above, axis=1)
    rows = np.arange(len(acc))
    prev = acc[rows, np.maximum(i - 1, 0)]
    frac = np.where(i > 0, (target - prev) / np.where(i > 0, acc[rows, i] - prev, 1.0), 0.0)
    out = np.where(i > 0, i + frac, 1.0)
    return np.where(above[rows, i], out, math.inf)


def intervals_to_target_many(
    model: ConvergenceModel, runs: Sequence[ScheduleRun], target: float
) -> np.ndarray:
    """Intervals the model takes to ``target`` on each run's batches, its last batch held on for up
    to :data:`HOLD_INTERVALS` more (:func:`crossing` of the noise-free accuracy; ``inf`` if never).
    The runs must share their steps per interval."""
    if not runs:
        return np.zeros(0)
    ks = {r.iterations for r in runs}
    if len(ks) != 1:
        raise ValueError(f"intervals_to_target_many needs runs of one interval length, got K = {sorted(ks)}")
    width = max(len(r.global_batch) for r in runs) + HOLD_INTERVALS
    gb = np.empty((len(runs), width))
    for i, r in enumerate(runs):
        n = len(r.global_batch)
        gb[i, :n] = r.global_batch
        gb[i, n:] = r.global_batch[-1]
    x = crossing_many(replay_many(model, gb, ks.pop()), target)
    # each run's horizon: its own intervals and HOLD_INTERVALS more (model_intervals_to_target's)
    limit = np.array([len(r.global_batch) + HOLD_INTERVALS for r in runs], dtype=np.float64)
    return np.where(x <= limit, x, math.inf)


def model_intervals_to_target(model: ConvergenceModel, run: ScheduleRun, target: float) -> float:
    """Intervals the model takes to ``target`` on ``run``'s batches (the last one held on for up to
    :data:`HOLD_INTERVALS` more), by :func:`crossing` of its noise-free accuracy; ``inf`` if never."""
    held = np.concatenate([run.global_batch, np.full(HOLD_INTERVALS, run.global_batch[-1])])
    ext = replace(run, global_batch=held, val_accuracy=np.zeros(len(held)))
    x = crossing(replay(model, ext), target)
    return math.inf if math.isnan(x) else x


def with_target_vector(params: ConvergenceParams, x: Sequence[float]) -> ConvergenceParams:
    scale, stretch, log_mem, log_k = (float(v) for v in x)
    return replace(
        params,
        shape_x=tuple(float(v) * scale for v in params.shape_x),
        stretch_exponent=stretch,
        batch_memory_progress=math.exp(log_mem),
        progress_noise_factor=math.exp(log_k),
    )


def target_bounds() -> tuple[np.ndarray, np.ndarray]:
    """Bounds of :func:`fit_intervals_to_target`'s vector (:data:`TARGET_PARAMETERS`)."""
    lo = np.array([0.2, 0.0, math.log(1.0), math.log(1.0)])
    hi = np.array([5.0, 1.5, math.log(1e4), math.log(1e3)])
    return lo, hi


def model_intervals(
    params: ConvergenceParams, runs: Sequence[ScheduleRun], target: float, max_gain: float | None = None
) -> np.ndarray:
    """:func:`intervals_to_target_many` of ``params`` over runs of any rules and interval lengths
    (batched per rule and length), the learning-rate multiplier capped at ``max_gain``."""
    out = np.empty(len(runs))
    for regime, k in sorted({(run.regime, run.iterations) for run in runs}):
        model = ConvergenceModel(params, regime)
        model.max_gain = max_gain
        idx = [i for i, run in enumerate(runs) if (run.regime, run.iterations) == (regime, k)]
        out[idx] = intervals_to_target_many(model, [runs[i] for i in idx], target)
    return out


def interval_residuals(
    params: ConvergenceParams, runs: Sequence[ScheduleRun], target: float, max_gain: float | None = None
) -> np.ndarray:
    """log(model intervals to ``target``) - log(measured) over ``runs`` (each must reach it; a model
    that never does counts its horizon), the model's learning-rate multiplier capped at ``max_gain``
    (the guards' cap the runs were made under; None: none)."""
    measured = np.array([crossing(run.val_accuracy, target) for run in runs])
    bad = np.flatnonzero(np.isnan(measured))
    if bad.size:
        run = runs[int(bad[0])]
        raise ValueError(f"run {run.name} seed {run.seed} never reaches the target {target}")
    model_x = model_intervals(params, runs, target, max_gain)
    limit = np.array([len(run.global_batch) + HOLD_INTERVALS for run in runs], dtype=np.float64)
    return np.log(np.minimum(model_x, limit) / measured)


@dataclass(frozen=True)
class TargetFit:
    params: ConvergenceParams
    before: ConvergenceParams
    rms_before: float  # RMS log error of the intervals to the target on the fitted runs
    rms_after: float
    runs: int
    at_bounds: tuple[str, ...]


def fit_intervals_to_target(
    params: ConvergenceParams,
    runs: Sequence[ScheduleRun],
    target: float,
    max_gain: float | None = None,
    grid: bool = True,
) -> TargetFit:
    """Fit :data:`TARGET_PARAMETERS` of ``params`` to the intervals ``runs`` took to ``target`` by
    least squares on :func:`interval_residuals`; deterministic (fixed starts: the profile's own
    values, then, with ``grid``, eight more over the stretch, the memory and the noise factor). Static curves alone
    cannot tell a larger batch that makes proportionally more progress but stretches the progress
    a target needs (a large noise factor, a large stretch) from one that makes less progress (a
    small factor, no stretch): runs whose batch changes mid-run can, as the batch memory carries the
    stretch of an early large batch into the rest of the run."""
    if not runs:
        raise ValueError("fit_intervals_to_target needs at least one run")
    lo, hi = target_bounds()
    x0 = np.clip(
        np.array([1.0, params.stretch_exponent, math.log(params.batch_memory_progress),
                  math.log(params.progress_noise_factor)]), lo + 1e-9, hi - 1e-9)  # fmt: skip
    starts = [x0] + [
        np.clip(np.array([1.0, s, math.log(mem), math.log(k)]), lo + 1e-9, hi - 1e-9)
        for s in (0.0, 0.5)
        for k in (3.0, 56.0)
        for mem in (20.0, 300.0)
        if grid
    ]
    res = multi_start_lsq(
        lambda x: interval_residuals(with_target_vector(params, x), runs, target, max_gain),
        starts, bounds=(lo, hi), x_scale=np.array([0.2, 0.3, 1.0, 1.0]), diff_step=1e-2,
    )  # fmt: skip
    fitted = with_target_vector(params, res.x)

    def rms(p: ConvergenceParams) -> float:
        return float(np.sqrt(np.mean(interval_residuals(p, runs, target, max_gain) ** 2)))

    span = hi - lo
    edge = tuple(
        f"{n} at its {'upper' if abs(v - h) <= 1e-3 * w else 'lower'} bound"
        for n, v, l_, h, w in zip(TARGET_PARAMETERS, res.x, lo, hi, span, strict=True)
        if abs(v - l_) <= 1e-3 * w or abs(v - h) <= 1e-3 * w
    )
    return TargetFit(fitted, params, rms(params), rms(fitted), len(runs), edge)
