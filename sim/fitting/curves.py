"""A convergence model fitted from measured static-batch training curves (a calibrated profile's
``convergence_models.json``), with the time-to-target refit that the calibration app reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sim.convergence import ConvergenceModel, ConvergenceParams
from sim.validation import check_int, check_range

# --------------------------------------------------------------------------------------------
# Convergence model from measured training curves
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """One static-batch training run as measured interval by interval.

    ``progress`` is in base-batch steps (the learning-rate gain summed over the steps, as the
    simulator counts it); ``grad_sqr`` and ``grad_var`` are |G|^2 and tr(Sigma) / M0 (the
    simulator's convention, see :mod:`sim.convergence`).
    """

    global_batch: int
    steps: np.ndarray
    progress: np.ndarray
    val_accuracy: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray
    train_accuracy: np.ndarray | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("curve global_batch", self.global_batch, 1)
        n = len(self.steps)
        for f in ("progress", "val_accuracy", "grad_sqr", "grad_var"):
            if len(getattr(self, f)) != n:
                raise ValueError(
                    f"curve at global batch {self.global_batch}: {f} has {len(getattr(self, f))} points, steps {n}"
                )
        if n < 2:
            raise ValueError(f"curve at global batch {self.global_batch} needs at least 2 points, got {n}")
        if np.any(np.diff(self.progress) <= 0):
            raise ValueError(f"curve at global batch {self.global_batch}: progress must increase strictly")


@dataclass
class ConvergenceFit:
    params: ConvergenceParams
    rmse_binned: float  # accuracy RMSE on the binned curves (what was fitted)
    rmse_raw: float  # accuracy RMSE on every measured point
    rmse_by_batch: dict[int, float]
    steps_to_target: list[dict[str, Any]]  # measured vs model steps to each target, per curve
    grad_rmse_log_noise: float
    notes: list[str] = field(default_factory=list)


def _bin_curves(curves: Sequence[Curve], bins: int) -> tuple[np.ndarray, list[Any]]:
    from sim.fitting.convergence import Trace

    p_end = min(float(c.progress[-1]) for c in curves)
    p_start = max(float(c.progress[0]) for c in curves)
    if p_end <= p_start:
        raise ValueError("the curves share no progress range: run each longer (curves.progress)")
    grid = np.unique(
        np.concatenate(
            [np.geomspace(p_start, p_end, bins // 2), np.linspace(p_start, p_end, bins - bins // 2)]
        )
    )
    traces = []
    for c in curves:
        lg = np.log(np.maximum(c.grad_sqr, 1e-30))
        lv = np.log(np.maximum(c.grad_var, 1e-30))
        traces.append(
            Trace(
                app="measured",
                global_batch=int(c.global_batch),
                epoch=np.arange(1, len(grid) + 1, dtype=np.float64),
                progress=grid.copy(),
                iteration=np.interp(grid, c.progress, c.steps),
                metric=np.interp(grid, c.progress, c.val_accuracy),
                grad_sqr=np.exp(np.interp(grid, c.progress, lg)),
                grad_var=np.exp(np.interp(grid, c.progress, lv)),
            )
        )
    return grid, traces


def _merge_curves(curves: Sequence[Curve], bins: int) -> tuple[np.ndarray, list[Any]]:
    """Bin the curves (see :func:`_bin_curves`) and average the seeds of each global batch."""
    grid, traces = _bin_curves(curves, bins)
    merged = []
    for m in sorted({c.global_batch for c in curves}):
        group = [t for t in traces if t.global_batch == m]
        merged.append(
            replace(
                group[0],
                iteration=np.mean([t.iteration for t in group], axis=0),
                metric=np.mean([t.metric for t in group], axis=0),
                grad_sqr=np.exp(np.mean([np.log(t.grad_sqr) for t in group], axis=0)),
                grad_var=np.exp(np.mean([np.log(t.grad_var) for t in group], axis=0)),
            )
        )
    return grid, merged


def _grad_only(grad: Any, name: str, base_batch: int, acc_chance: float, total: float) -> ConvergenceParams:
    """Fitted gradient statistics with a placeholder accuracy shape (for stepping progress only)."""
    return ConvergenceParams(
        name=name, base_batch=int(base_batch), total_progress=total, progress_knots=grad.progress_knots,
        log_grad_sqr=grad.log_grad_sqr, log_grad_var=grad.log_grad_var, acc_chance=acc_chance,
        acc_ceiling=1.0, ref_batch=float(base_batch), gap_per_doubling=0.0, stretch_exponent=0.0,
        shape_x=(0.0, total), shape_y=(0.0, 1.0), batch_memory_progress=total,
    )  # fmt: skip


def simulated_progress(model: ConvergenceModel, curve: Curve) -> np.ndarray:
    """The progress the simulator would count for ``curve``'s steps at its global batch: each
    measured interval of ``n`` steps advances ``n * r(M, p + n r(M, p) / 2)`` (the engine's midpoint rule)."""
    m = float(curve.global_batch)
    p = q = 0.0
    out = []
    for n in np.diff(np.concatenate([[0.0], curve.steps])):
        dp, dq = model.advance(m, p, q, n)
        p, q = p + dp, q + dq
        out.append(p)
    return np.array(out)


def _measured_steps(curves: Sequence[Curve], target: float) -> dict[int, float]:
    """Median over seeds of the first measured step count at which each batch reaches ``target``
    (batches with a seed that never does are left out)."""
    out = {}
    for m in sorted({c.global_batch for c in curves}):
        hits = []
        for c in curves:
            if c.global_batch == m:
                h = np.nonzero(c.val_accuracy >= target)[0]
                hits.append(float(c.steps[h[0]]) if len(h) else math.nan)
        if hits and not any(math.isnan(x) for x in hits):
            out[m] = float(np.median(hits))
    return out


#: Bounds of the fitted progress noise factor.
_NOISE_FACTOR_RANGE = (1.0, 1000.0)
#: Passes of the fit with a time-to-target refit: each re-expresses the curves' progress with the
#: progress noise factor the previous pass fitted (the gradient statistics and the accuracy shape
#: are functions of progress in the simulator's units), then refits.
_NOISE_FACTOR_PASSES = 3


def _refit_time_to_target(
    params: ConvergenceParams, curves: Sequence[Curve], targets: Sequence[float]
) -> tuple[ConvergenceParams, str, float]:
    """Refit the batch dependence of the time to the targets: the shape's progress scale, the
    stretch exponent and the progress noise factor (``ConvergenceParams.progress_noise_factor``: how
    much more a larger batch speeds progress than the reported noise scale says), by least squares
    on log steps-to-target (model vs the measured medians), as
    :func:`sim.fitting.tradeoff.fit_tradeoff` fits minutes to peak. The shape, ceiling and
    gradient statistics (and so the noise a controller reads) stay those of the curve fit."""
    from sim.fitting.lsq import multi_start_lsq
    from sim.fitting.tradeoff import progress_to_accuracy, steps_to_progress

    pairs = [(m, a, n) for a in targets for m, n in _measured_steps(curves, a).items()]
    if len({m for m, _, _ in pairs}) < 2:
        return (
            params,
            "time-to-target refit skipped: fewer than two batches reach the targets in every seed",
            math.nan,
        )

    def make(z: np.ndarray) -> ConvergenceParams:
        return replace(
            params,
            shape_x=tuple(float(np.exp(z[0])) * x for x in params.shape_x),
            stretch_exponent=float(z[1]),
            progress_noise_factor=float(np.exp(z[2])),
        )

    def residuals(z: np.ndarray) -> np.ndarray:
        model = ConvergenceModel(make(z), "adascale")
        out = []
        for m, a, n in pairs:
            p = progress_to_accuracy(model, m, a)
            out.append(math.log(steps_to_progress(model, m, p) / n) if math.isfinite(p) else 5.0)
        return np.array(out)

    z0 = np.array([0.0, params.stretch_exponent, math.log(params.progress_noise_factor)])
    before = float(np.sqrt(np.mean(residuals(z0) ** 2)))
    best = multi_start_lsq(
        residuals,
        ([0.0, s0, lk] for s0 in (0.0, params.stretch_exponent, 0.5) for lk in (0.0, math.log(30.0))),
        bounds=([math.log(0.2), 0.0, math.log(_NOISE_FACTOR_RANGE[0])],
                [math.log(5.0), 2.0, math.log(_NOISE_FACTOR_RANGE[1])]),
    )  # fmt: skip
    after = float(np.sqrt(np.mean(best.fun**2)))
    if after >= before:
        return params, f"time-to-target refit kept the curve fit (RMS log error {before:.3f})", before
    out = make(best.x)
    return (
        out,
        (
            f"time-to-target refit at {list(targets)}: shape progress x{math.exp(best.x[0]):.3f}, stretch exponent "
            f"{params.stretch_exponent:.3f} -> {out.stretch_exponent:.3f}, progress noise factor "
            f"{params.progress_noise_factor:.3g} -> {out.progress_noise_factor:.3g}; RMS log error of steps to target "
            f"{before:.3f} -> {after:.3f} over {len(pairs)} (batch, target) points"
        ),
        after,
    )


def fit_convergence_curves(
    curves: Sequence[Curve],
    *,
    name: str,
    base_batch: int,
    acc_chance: float,
    memory_fraction: float = 0.1,
    bins: int = 24,
    targets: Sequence[float] = (),
    resimulate_progress: int = 2,
    refit_targets: Sequence[float] = (),
) -> ConvergenceFit:
    """Fit :class:`ConvergenceParams` to measured static-batch curves with
    :mod:`sim.fitting.convergence`'s machinery (gradient statistics, then the accuracy shape, ceiling,
    gap and stretch by weighted least squares).

    The curves are binned on a common progress grid (``bins`` points, half geometric, half linear,
    over the progress range every curve covers), which plays the part of the reference traces'
    epochs. Curves at the same global batch (several seeds) are averaged bin by bin first.

    Args:
        curves: static runs, at least two distinct global batches.
        name: the model's name (the workload's ``convergence`` key).
        base_batch: M0 of the real learning-rate scaling (progress unit).
        acc_chance: accuracy of an untrained model (1 / classes).
        memory_fraction: batch-memory time constant as a fraction of the fitted progress range.
        bins: progress bins.
        targets: accuracies for the steps-to-target comparison (model vs each measured curve).
        resimulate_progress: rounds of re-expressing each curve's progress in the simulator's
            units (the AdaScale gain with the fitted noise scale, integrated over the measured steps)
            and refitting the gradient statistics. The measured progress sums the real backend's
            gains, which use its noisy noise-scale estimate (biased low at large batches); in the
            simulator's units a simulated static run reaches each accuracy after as many steps as
            the measured one. 0 keeps the measured progress.
        refit_targets: accuracies at which the batch dependence is refitted to the measured steps
            (:func:`_refit_time_to_target`); empty: the least-squares fit of the curves alone.
    """
    from sim.fitting.convergence import accuracy_rmse, fit_accuracy, fit_grad_stats
    from sim.fitting.tradeoff import progress_to_accuracy, steps_to_progress

    check_range("acc_chance", acc_chance, 0.0, 1.0)
    check_range("memory_fraction", memory_fraction, 0.0, 1.0, low_open=True)
    check_int("bins", bins, 4)
    batches = sorted({c.global_batch for c in curves})
    if len(batches) < 2:
        raise ValueError(
            f"fitting a convergence model needs curves at 2 or more global batches, got {batches}"
        )
    grid, merged = _merge_curves(curves, bins)
    grad = fit_grad_stats(merged, base_batch)
    for _ in range(resimulate_progress):
        # Progress in the simulator's own units: r_ada with the fitted noise scale, step by step.
        stepper = ConvergenceModel(
            _grad_only(grad, name, base_batch, acc_chance, float(grid[-1])), "adascale"
        )
        curves = [replace(c, progress=simulated_progress(stepper, c)) for c in curves]
        grid, merged = _merge_curves(curves, bins)
        grad = fit_grad_stats(merged, base_batch)
    # The gradient statistics are functions of that counter (q in sim.convergence); the accuracy is
    # a function of the progress p, which differs from q once a progress noise factor k is fitted:
    # each further pass re-expresses the curves in p at the factor the previous pass fitted.
    in_q, k, notes, best = curves, 1.0, [], None
    curves_k = 1.0  # the factor the curves' progress is expressed at
    for outer in range(_NOISE_FACTOR_PASSES if refit_targets else 1):
        if k != 1.0:
            stepper = ConvergenceModel(
                replace(
                    _grad_only(grad, name, base_batch, acc_chance, float(grid[-1])), progress_noise_factor=k
                ),
                "adascale",
            )
            curves = [replace(c, progress=simulated_progress(stepper, c)) for c in in_q]
            grid, merged = _merge_curves(curves, bins)
            curves_k = k
        acc = fit_accuracy(merged, acc_chance, ref_batch=float(batches[0]))
        total = float(grid[-1])
        train_gaps = [
            float(np.mean(c.train_accuracy[-3:] - c.val_accuracy[-3:]))
            for c in curves
            if c.train_accuracy is not None
        ]
        train_gap = float(np.clip(np.mean(train_gaps), 0.0, 1.0)) if train_gaps else 0.0
        params = ConvergenceParams(
            name=name,
            base_batch=int(base_batch),
            total_progress=total,
            progress_knots=grad.progress_knots,
            log_grad_sqr=grad.log_grad_sqr,
            log_grad_var=grad.log_grad_var,
            acc_chance=acc_chance,
            acc_ceiling=acc.acc_ceiling,
            ref_batch=float(batches[0]),
            gap_per_doubling=acc.gap_per_doubling,
            stretch_exponent=acc.stretch_exponent,
            shape_x=acc.shape_x,
            shape_y=acc.shape_y,
            batch_memory_progress=memory_fraction * total,
            train_gap=train_gap,
            progress_noise_factor=k,
        )
        if not refit_targets:
            break
        params, note, rms = _refit_time_to_target(params, curves, refit_targets)
        notes.append(f"pass {outer + 1}: {note}")
        if best is None or rms < best[0]:
            best = (rms, params, outer + 1)
        if params.progress_noise_factor == k or resimulate_progress == 0:
            break
        k = params.progress_noise_factor
    if best is not None and len(notes) > 1:
        params = best[1]
        notes.append(f"kept pass {best[2]} (the lowest RMS log error of steps to target)")
        if params.progress_noise_factor != curves_k:  # the curves in the progress units of the kept pass
            stepper = ConvergenceModel(replace(params, lr_stable_gain=None), "adascale")
            curves = [replace(c, progress=simulated_progress(stepper, c)) for c in in_q]
            grid, merged = _merge_curves(curves, bins)
    model = ConvergenceModel(params, "adascale")
    rmse = accuracy_rmse(model, merged)
    params = replace(params, fit_rmse=rmse["all"])
    raw_res, by_batch = [], {}
    for m in batches:
        res = []
        for c in curves:
            if c.global_batch == m:
                res.append(model.accuracy_many(c.progress, math.log2(m)) - c.val_accuracy)
        r = np.concatenate(res)
        by_batch[m] = float(np.sqrt(np.mean(r**2)))
        raw_res.append(r)
    stt = []
    for target in targets:
        for c in curves:
            hit = np.nonzero(c.val_accuracy >= target)[0]
            measured = float(c.steps[hit[0]]) if len(hit) else math.nan
            p = progress_to_accuracy(model, c.global_batch, target)
            predicted = steps_to_progress(model, c.global_batch, p) if math.isfinite(p) else math.inf
            stt.append({
                "target": target, "global_batch": c.global_batch, "seed": c.seed,
                "measured_steps": measured, "model_steps": predicted,
                "rel_error": predicted / measured - 1.0 if math.isfinite(predicted) and measured > 0 else math.nan,
            })  # fmt: skip
    notes.insert(
        0,
        f"{len(curves)} curves at global batches {batches}; binned on {len(grid)} progress points in "
        f"[{grid[0]:.3g}, {grid[-1]:.3g}] base-batch steps; curves at the same batch averaged per bin",
    )
    return ConvergenceFit(
        params=params,
        rmse_binned=float(rmse["all"]),
        rmse_raw=float(np.sqrt(np.mean(np.concatenate(raw_res) ** 2))),
        rmse_by_batch=by_batch,
        steps_to_target=stt,
        grad_rmse_log_noise=float(grad.rmse_log_noise_rows),
        notes=notes,
    )
