"""Fitting the training-progress model (:mod:`sim.convergence`) to measured convergence traces.

Run by ``python -m experiments.fit_convergence``, which writes ``sim/data/convergence_models.json``
and the report ``results/fit/convergence_fit.*``. Three steps per measured application:

1. Gradient statistics. log |G|^2 and log B_noise (B_noise = M0 * grad_var / grad_sqr) are pooled
   over the batch sizes of the AdaScale runs (progress is comparable across them), reduced to
   per-epoch medians (rows with ``grad_sqr = 0``, an estimate clipped at zero as AdaptDL writes
   it, are left out: their noise scale is unbounded; :attr:`GradFit.left_out` lists them),
   smoothed by a GCV smoothing spline over log(progress) and sampled at knots;
   log B_noise is made non-decreasing by isotonic regression (the noise scale grows as training
   proceeds). log grad_var = log B_noise + log |G|^2 - log M0, so the model's ratio is exactly the
   fitted noise scale.
2. Accuracy. The shape knots, acc_ceiling, gap_per_doubling and stretch_exponent are fitted by
   least squares on all batches' traces jointly; a static run's batch memory is log2(M).
3. Ordering. Epochs to a target accuracy, model vs traces, compared by Kendall's tau and
   Spearman's rho across batch sizes.

A workload without traces of its own (ResNet-34 on CIFAR-100, no learning-rate scaling) borrows
the CIFAR-10 shape and gradient statistics, stretched in progress, and is fitted to the static-batch
trade-off reported by DYNAMIX (``reference/tradeoff_resnet34_cifar100.csv``): see
:func:`fit_tradeoff`.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import optimize, stats
from scipy.interpolate import PchipInterpolator, make_smoothing_spline

from sim.convergence import ConvergenceModel, ConvergenceParams
from sim.datafiles import data_path
from sim.validation import check_choice, check_range

log = logging.getLogger(__name__)

TRACES_FILE = "reference/convergence_traces.csv"
MAX_NONE_EXPONENT = 0.5  # = the sqrt rule's exponent; see ConvergenceParams


@dataclass(frozen=True)
class AppSpec:
    """What the traces do not say about an application: how to read its metric, what to target."""

    app: str
    acc_chance: float  # metric of an untrained model (1 / classes for top-1 accuracy)
    metric_scale: float  # multiplies the CSV metric into a fraction
    targets: tuple[float, ...]  # accuracies (fractions) for the epochs-to-target ordering
    train_gap: float  # training accuracy above validation at the end (not in the traces)
    chance_note: str
    train_gap_note: str


#: acc_chance: top-1 accuracy of a uniform guess is 1 / classes. NCF's hit rate is HR@10 among the
#: held-out item and 99 sampled negatives (He et al. 2017), so a random ranking scores 10 / 100.
#: SQuAD F1 of an untrained span predictor is near 0. train_gap: ResNets fit CIFAR's training set
#: (~100 % training accuracy, Zhang et al. 2017), so the gap is 1 - ceiling there; it is not
#: known for the other applications and set to 0.
APP_SPECS: dict[str, AppSpec] = {
    "cifar10": AppSpec(
        "cifar10", 1 / 10, 1.0, (0.90, 0.92, 0.93, 0.94), float("nan"),
        "1/10 classes", "1 - acc_ceiling (ResNet-18 interpolates CIFAR-10's training set)",
    ),
    "imagenet": AppSpec(
        "imagenet", 1 / 1000, 1.0, (0.50, 0.70, 0.74, 0.75), 0.0,
        "1/1000 classes", "not measured; 0",
    ),
    "bert": AppSpec(
        "bert", 0.0, 0.01, (0.86, 0.87, 0.88), 0.0,
        "F1 of an untrained span predictor ~ 0", "not measured; 0",
    ),
    "ncf": AppSpec(
        "ncf", 10 / 100, 1.0, (0.67, 0.68, 0.69), 0.0,
        "HR@10 of a random ranking of 1 positive + 99 negatives", "not measured; 0",
    ),
}  # fmt: skip


# --- traces -------------------------------------------------------------------------------------
#: The per-epoch (row) arrays of a :class:`Trace`.
ROW_FIELDS = ("epoch", "progress", "iteration", "metric", "grad_sqr", "grad_var")


@dataclass(frozen=True)
class Trace:
    """One static-batch run: per-epoch rows of ``convergence_traces.csv``."""

    app: str
    global_batch: int
    epoch: np.ndarray
    progress: np.ndarray
    iteration: np.ndarray
    metric: np.ndarray  # as a fraction (metric_scale applied)
    grad_sqr: np.ndarray
    grad_var: np.ndarray


def common_epochs(traces: Sequence[Trace]) -> set[int]:
    """The epoch numbers every one of ``traces`` measured (the fits compare runs epoch by epoch)."""
    return set.intersection(*(set(t.epoch.tolist()) for t in traces))


def load_traces(path: str | Path | None = None) -> dict[str, list[Trace]]:
    """All traces by application, each list sorted by global batch."""
    rows: dict[tuple[str, int], list[dict[str, str]]] = {}
    with open(path or data_path(TRACES_FILE), newline="") as fh:
        for row in csv.DictReader(fh):
            rows.setdefault((row["app"], int(row["global_batch"])), []).append(row)
    out: dict[str, list[Trace]] = {}
    for (app, batch), rs in sorted(rows.items()):
        rs.sort(key=lambda r: int(r["epoch"]))
        cols = {k: np.array([float(r[k]) for r in rs]) for k in rs[0] if k not in ("app", "model")}
        scale = APP_SPECS[app].metric_scale if app in APP_SPECS else 1.0
        out.setdefault(app, []).append(
            Trace(app, batch, cols["epoch"], cols["progress"], cols["iteration"],
                  cols["metric"] * scale, cols["grad_sqr"], cols["grad_var"])
        )  # fmt: skip
    return out


def epoch_bins(traces: Sequence[Trace]) -> tuple[np.ndarray, np.ndarray]:
    """Epoch numbers present in every trace, and the median progress at each."""
    common = set(traces[0].epoch.tolist())
    for t in traces[1:]:
        common &= set(t.epoch.tolist())
    epochs = np.array(sorted(common))
    prog = np.median([t.progress[np.isin(t.epoch, epochs)] for t in traces], axis=0)
    return epochs, prog


def binned_median(traces: Sequence[Trace], values: Callable[[Trace], np.ndarray]) -> np.ndarray:
    """Median over the traces (batch sizes) of ``values(trace)`` at each common epoch."""
    epochs, _ = epoch_bins(traces)
    return np.median([values(t)[np.isin(t.epoch, epochs)] for t in traces], axis=0)


def log_noise_scale(trace: Trace, base_batch: float) -> np.ndarray:
    return np.log(base_batch * trace.grad_var / trace.grad_sqr)


def knot_epochs(n_epochs: int, curves: Sequence[np.ndarray], jump_factor: float = 6.0) -> np.ndarray:
    """Knot epochs: geometric and linear spacing, plus both sides of every jump of a curve.

    They are 1-based positions among the ``n_epochs`` epochs the runs share (:func:`epoch_bins`;
    the epoch numbers themselves when the runs log every epoch from 1): index the shared epochs
    with ``knot_epochs(...) - 1``, so that runs logged every other epoch, or with epochs left out,
    get distinct knots.

    A jump is a step between consecutive epochs larger than ``jump_factor`` times the curve's median
    absolute step (the learning-rate decays of step schedules); knots on both sides keep PCHIP from
    smearing it over a long interval.
    """
    if n_epochs <= 12:
        return np.arange(1, n_epochs + 1)
    ks = set(np.unique(np.round(np.geomspace(1, n_epochs, 14))).astype(int).tolist())
    ks |= set(np.round(np.linspace(1, n_epochs, 12)).astype(int).tolist())
    for c in curves:
        d = np.abs(np.diff(c))
        thresh = jump_factor * max(float(np.median(d)), 1e-12)
        for i in np.nonzero(d > thresh)[0]:
            if i + 1 >= 4:  # the first epochs are dense already
                ks |= {int(i) + 1, int(i) + 2}
    return np.array(sorted(ks))


# --- 1. gradient statistics ---------------------------------------------------------------------
@dataclass(frozen=True)
class GradFit:
    """The gradient statistics' fit; ``left_out``: the (global batch, epoch) rows whose
    ``grad_sqr`` is 0 (a clipped estimate), which the fit did not use."""

    progress_knots: tuple[float, ...]
    log_grad_sqr: tuple[float, ...]
    log_grad_var: tuple[float, ...]
    rmse_log_noise_bins: float  # fitted curve vs per-epoch pooled medians (smoothing error)
    rmse_log_noise_rows: float  # fitted curve vs every trace row (includes the batch spread)
    log_noise_bias_by_batch: dict[int, float]  # mean (trace - model) log B_noise per batch
    noise_scale_at_epochs: dict[int, float]  # fitted B_noise at a few epochs
    left_out: tuple[tuple[int, int], ...] = ()


def _smooth(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """GCV smoothing spline of y(x), evaluated at ``at`` (the data themselves if < 5 points)."""
    if len(x) < 5:
        return np.interp(at, x, y)
    return make_smoothing_spline(x, y)(at)


def _with_grad_sqr(traces: Sequence[Trace]) -> tuple[list[Trace], tuple[tuple[int, int], ...]]:
    """The traces' rows with ``grad_sqr > 0`` (runs left with none dropped), and the (global batch,
    epoch) of the rows left out: a 0 is a squared-gradient estimate clipped at zero (AdaptDL's
    ``GradientNoiseScale.sqr_avg``), whose noise scale M0 grad_var / grad_sqr has no bound."""
    kept, left_out = [], []
    for t in traces:
        ok = t.grad_sqr > 0
        left_out += [(t.global_batch, int(e)) for e in t.epoch[~ok]]
        if ok.all():
            kept.append(t)
        elif ok.any():
            kept.append(replace(t, **{k: getattr(t, k)[ok] for k in ROW_FIELDS}))
    return kept, tuple(left_out)


def _check_grad_rows(traces: Sequence[Trace], kept: Sequence[Trace], left_out: tuple) -> None:
    """Refuse, naming the cause, traces whose usable gradient statistics cannot be fitted."""
    batches = [t.global_batch for t in traces]
    dropped = (
        f" after leaving out the {len(left_out)} row(s) with grad_sqr = 0 (clipped estimates)"
        if left_out
        else ""
    )
    if not kept:
        raise ValueError(
            f"grad_sqr: every row of the runs at global batches {batches} is 0 (clipped estimates); "
            "the noise scale M0 grad_var / grad_sqr cannot be fitted without a positive one"
        )
    common = common_epochs(kept)
    if len(common) < 2:
        raise ValueError(
            f"grad_sqr: the runs at global batches {[t.global_batch for t in kept]} share "
            f"{len(common)} epoch(s) with grad_sqr > 0{dropped}; the noise-scale fit takes per-epoch "
            "medians over the runs and needs at least 2 epochs that every run measured"
        )


def fit_grad_stats(traces: Sequence[Trace], base_batch: int) -> GradFit:
    all_traces = traces
    traces, left_out = _with_grad_sqr(all_traces)
    _check_grad_rows(all_traces, traces, left_out)
    epochs, prog = epoch_bins(traces)
    med_lb = binned_median(traces, lambda t: log_noise_scale(t, base_batch))
    med_lg = binned_median(traces, lambda t: np.log(t.grad_sqr))
    ks = knot_epochs(len(epochs), [med_lb, med_lg])
    kidx = ks - 1
    xk = np.log(prog[kidx])
    lb = _smooth(np.log(prog), med_lb, xk)
    lb = optimize.isotonic_regression(lb, increasing=True).x
    lg = _smooth(np.log(prog), med_lg, xk)
    lv = lb + lg - math.log(base_batch)
    knots = prog[kidx]
    fitted = PchipInterpolator(knots, lb)
    res_bins = med_lb - fitted(np.clip(prog, knots[0], knots[-1]))
    bias, res_rows = {}, []
    for t in traces:
        r = log_noise_scale(t, base_batch) - fitted(np.clip(t.progress, knots[0], knots[-1]))
        bias[t.global_batch] = float(np.mean(r))
        res_rows.append(r)
    res_all = np.concatenate(res_rows)
    at = [e for e in (1, 10, len(epochs) // 2, len(epochs)) if e in set(epochs.tolist())]
    b_at = {int(e): float(np.exp(fitted(prog[epochs == e][0]))) for e in sorted(set(at))}
    return GradFit(
        progress_knots=tuple(float(v) for v in knots),
        log_grad_sqr=tuple(float(v) for v in lg),
        log_grad_var=tuple(float(v) for v in lv),
        rmse_log_noise_bins=float(np.sqrt(np.mean(res_bins**2))),
        rmse_log_noise_rows=float(np.sqrt(np.mean(res_all**2))),
        log_noise_bias_by_batch=bias,
        noise_scale_at_epochs=b_at,
        left_out=left_out,
    )


# --- 2. accuracy --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AccFit:
    shape_x: tuple[float, ...]
    shape_y: tuple[float, ...]
    acc_ceiling: float
    gap_per_doubling: float
    stretch_exponent: float


def _shape_from_theta(theta: np.ndarray) -> np.ndarray:
    inc = np.exp(np.concatenate([[0.0], theta]))
    return np.concatenate([[0.0], np.cumsum(inc) / inc.sum()])


def _acc_eval(
    sx: np.ndarray, sy: np.ndarray, ceil: float, gap: float, stretch_exp: float,
    chance: float, ref_log2: float, prog: np.ndarray, mem: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """The accuracy equation of :class:`ConvergenceModel` with an exact PCHIP (for fitting)."""
    d = np.maximum(0.0, mem - ref_log2)
    x = np.clip(prog / 2.0 ** (d * stretch_exp), 0.0, sx[-1])
    s = np.clip(PchipInterpolator(sx, sy)(x), 0.0, 1.0)
    c = np.maximum(chance, ceil - gap * d)
    return chance + (c - chance) * s


def fit_accuracy(traces: Sequence[Trace], acc_chance: float, ref_batch: float) -> AccFit:
    """Joint least-squares fit of shape, ceiling, gap and stretch on all batches' traces.

    Two passes: an unweighted fit, then one weighted by 1 / the per-epoch RMS residual of the first
    pass (pooled over batch sizes, smoothed over 5 epochs, floored at a quarter of its median).
    The traces are heteroscedastic (early epochs of the image runs scatter by several points, late
    ones by a tenth of a point), and an unweighted fit lets the noisy first epochs set the batch
    dependence that matters for epochs-to-target late in training.
    """
    epochs, prog = epoch_bins(traces)
    med_acc = binned_median(traces, lambda t: t.metric)
    ks = knot_epochs(len(epochs), [med_acc])
    sx = np.concatenate([[0.0], prog[ks - 1]])
    p_all = np.concatenate([t.progress for t in traces])
    m_all = np.concatenate([np.full(len(t.progress), math.log2(t.global_batch)) for t in traces])
    y_all = np.concatenate([t.metric for t in traces])
    e_all = np.concatenate([np.searchsorted(epochs, t.epoch) for t in traces])
    ref_log2 = math.log2(ref_batch)
    # Start from the smallest batch's running maximum.
    t0 = traces[0]
    ceil0 = float(np.max(med_acc))
    frac = np.maximum.accumulate(np.clip((t0.metric - acc_chance) / (ceil0 - acc_chance), 0, 1))
    y0 = np.interp(sx, np.concatenate([[0.0], t0.progress]), np.concatenate([[0.0], frac]))
    y0 = np.maximum.accumulate(y0 + 1e-3 * np.arange(len(y0)))
    inc = np.maximum(np.diff(y0), 1e-4)
    theta0 = np.log(inc[1:] / inc[0])
    n = len(theta0)
    lo = np.concatenate([np.full(n, -20.0), [acc_chance, 0.0, 0.0]])
    hi = np.concatenate([np.full(n, 20.0), [1.0, 0.2, 2.0]])
    z = np.clip(np.concatenate([theta0, [ceil0, 0.002, 0.1]]), lo + 1e-9, hi - 1e-9)

    def predict(z: np.ndarray) -> np.ndarray:
        sy = _shape_from_theta(z[:n])
        return _acc_eval(sx, sy, z[n], z[n + 1], z[n + 2], acc_chance, ref_log2, p_all, m_all)

    w = np.ones_like(y_all)
    for _ in range(2):
        sol = optimize.least_squares(
            lambda z, w=w: np.concatenate([w * (predict(z) - y_all), 1e-3 * z[:n]]),
            z, bounds=(lo, hi),
        )  # fmt: skip
        z = sol.x
        sq = np.bincount(e_all, (predict(z) - y_all) ** 2, len(epochs))
        sigma = np.sqrt(sq / np.maximum(np.bincount(e_all, minlength=len(epochs)), 1))
        if len(sigma) >= 5:
            sigma = np.convolve(np.pad(sigma, 2, mode="edge"), np.ones(5) / 5, mode="valid")
        sigma = np.maximum(sigma, 0.25 * float(np.median(sigma)))
        w = 1.0 / sigma[e_all]
        w /= np.sqrt(np.mean(w**2))
    return AccFit(
        shape_x=tuple(float(v) for v in sx),
        shape_y=tuple(float(v) for v in _shape_from_theta(z[:n])),
        acc_ceiling=float(z[n]),
        gap_per_doubling=float(z[n + 1]),
        stretch_exponent=float(z[n + 2]),
    )


def accuracy_rmse(model: ConvergenceModel, traces: Sequence[Trace]) -> dict[str, float]:
    """RMSE of the model's accuracy (static batch memory) over the traces: overall and per batch."""
    out, res = {}, []
    for t in traces:
        pred = model.accuracy_many(t.progress, math.log2(t.global_batch))
        r = pred - t.metric
        out[str(t.global_batch)] = float(np.sqrt(np.mean(r**2)))
        res.append(r)
    out["all"] = float(np.sqrt(np.mean(np.concatenate(res) ** 2)))
    return out


def iteration_error(model: ConvergenceModel, traces: Sequence[Trace]) -> dict[str, float]:
    """Relative error of the optimiser steps AdaScale needs for each trace's final progress.

    steps(P) = integral_0^P dp / r_ada(M, p): this is what the fitted noise scale buys the simulator.
    """
    out = {}
    for t in traces:
        grid = np.linspace(0.0, t.progress[-1], 4001)
        r = model.progress_per_step_many(t.global_batch, grid)
        steps = float(np.sum(np.diff(grid) * 0.5 * (1 / r[1:] + 1 / r[:-1])))
        out[str(t.global_batch)] = steps / float(t.iteration[-1]) - 1.0
    return out


# --- 3. ordering of epochs to target ------------------------------------------------------------
def trace_epochs_to_target(trace: Trace, target: float) -> float:
    """First epoch whose metric reaches ``target`` (NaN if none)."""
    hit = np.nonzero(trace.metric >= target)[0]
    return float(trace.epoch[hit[0]]) if len(hit) else float("nan")


def model_epochs_to_target(model: ConvergenceModel, trace: Trace, target: float) -> float:
    """Epochs the model needs to reach ``target`` at the trace's batch, on the trace's progress axis.

    The crossing progress is found on a fine grid and turned into (fractional) epochs through the
    trace's own progress column, so both sides count epochs of the same progress.
    """
    grid = np.linspace(0.0, t_end := float(trace.progress[-1]), 20001)
    acc = model.accuracy_many(grid, math.log2(trace.global_batch))
    hit = np.nonzero(acc >= target)[0]
    if not len(hit):
        return float("nan")
    p = float(grid[hit[0]])
    if p >= t_end:
        return float(trace.epoch[-1])
    return float(np.interp(p, np.concatenate([[0.0], trace.progress]),
                           np.concatenate([[0.0], trace.epoch])))  # fmt: skip


def _rank_ready(v: np.ndarray, worst: float) -> np.ndarray:
    return np.where(np.isnan(v), worst, v)


def ordering(model: ConvergenceModel, traces: Sequence[Trace], targets: Sequence[float]) -> list[dict]:
    """Kendall's tau-b and Spearman's rho between model and trace epochs-to-target, per target.

    A run that never reaches the target ranks last (after the longest trace). tau and rho are NaN
    where either side has a single distinct value (no ordering to compare).
    """
    out = []
    for target in targets:
        te = np.array([trace_epochs_to_target(t, target) for t in traces])
        me = np.array([model_epochs_to_target(model, t, target) for t in traces])
        worst = max(float(t.epoch[-1]) for t in traces) + 1.0
        # Model epochs are compared at 0.1-epoch resolution: finer differences come only from the
        # traces' slightly different progress per epoch, not from the model's batch dependence.
        a, b = _rank_ready(te, worst), np.round(_rank_ready(me, worst), 1)
        if len(set(a.tolist())) < 2 or len(set(b.tolist())) < 2:
            tau = rho = float("nan")
        else:
            tau = float(stats.kendalltau(a, b).statistic)
            rho = float(stats.spearmanr(a, b).statistic)
        out.append({
            "target": target,
            "batches": [t.global_batch for t in traces],
            "trace_epochs": [None if math.isnan(v) else v for v in te.tolist()],
            "model_epochs": [None if math.isnan(v) else round(v, 2) for v in me.tolist()],
            "kendall_tau": tau,
            "spearman_rho": rho,
        })  # fmt: skip
    return out


# --- one measured application -------------------------------------------------------------------
@dataclass
class AppFit:
    params: ConvergenceParams
    grad: GradFit
    rmse: dict[str, float]
    ordering: list[dict]
    iteration_rel_error: dict[str, float]
    notes: list[str] = field(default_factory=list)


def fit_app(app: str, traces: Sequence[Trace], memory_fraction: float, spec: AppSpec | None = None) -> AppFit:
    """Fit the convergence model of one measured application from its traces.

    ``spec``: what the traces do not say (:data:`APP_SPECS`'s entry of a shipped application; for
    a new one :func:`sim.traces_table.app_spec` builds it from the workload's metric).
    """
    if spec is None:
        check_choice("application", app, APP_SPECS)
        spec = APP_SPECS[app]
    check_range("batch memory fraction", memory_fraction, 0.0, 1.0, low_open=True)
    base_batch = min(t.global_batch for t in traces)
    grad = fit_grad_stats(traces, base_batch)
    acc = fit_accuracy(traces, spec.acc_chance, ref_batch=base_batch)
    total = float(np.median([t.progress[-1] for t in traces]))
    train_gap = 1.0 - acc.acc_ceiling if math.isnan(spec.train_gap) else spec.train_gap
    params = ConvergenceParams(
        name=app,
        base_batch=base_batch,
        total_progress=total,
        progress_knots=grad.progress_knots,
        log_grad_sqr=grad.log_grad_sqr,
        log_grad_var=grad.log_grad_var,
        acc_chance=spec.acc_chance,
        acc_ceiling=acc.acc_ceiling,
        ref_batch=float(base_batch),
        gap_per_doubling=acc.gap_per_doubling,
        stretch_exponent=acc.stretch_exponent,
        shape_x=acc.shape_x,
        shape_y=acc.shape_y,
        batch_memory_progress=memory_fraction * total,
        train_gap=train_gap,
    )
    model = ConvergenceModel(params, "adascale")
    rmse = accuracy_rmse(model, traces)
    params = replace(params, fit_rmse=rmse["all"])
    notes = []
    if len(epoch_bins(traces)[0]) < 12:
        notes.append(
            f"only {len(epoch_bins(traces)[0])} epochs per run: the shape has one knot per epoch "
            "and the gradient statistics are the per-epoch medians, unsmoothed below 5 epochs"
        )
    if grad.left_out:
        notes.append(
            f"{len(grad.left_out)} row(s) with grad_sqr = 0 (a squared-gradient estimate clipped at zero) "
            f"left out of the noise-scale fit (global batch: epochs): {_rows_text(grad.left_out)}"
        )
    return AppFit(params, grad, rmse, ordering(model, traces, spec.targets),
                  iteration_error(model, traces), notes)  # fmt: skip


def _rows_text(rows: Sequence[tuple[int, int]]) -> str:
    by_batch: dict[int, list[int]] = {}
    for batch, epoch in rows:
        by_batch.setdefault(batch, []).append(epoch)
    return "; ".join(f"{b}: {', '.join(str(e) for e in es)}" for b, es in sorted(by_batch.items()))


def summary(fit: AppFit) -> dict:
    """JSON-ready diagnostics of one application fit."""
    grad = {k: v for k, v in asdict(fit.grad).items() if not k.startswith(("progress_", "log_grad"))}
    if not grad["left_out"]:
        del grad["left_out"]  # the shipped traces have none: their report keeps its keys
    return {
        "app": fit.params.name,
        "grad": grad,
        "accuracy_rmse": fit.rmse,
        "ordering": fit.ordering,
        "adascale_steps_rel_error": fit.iteration_rel_error,
        "notes": fit.notes,
    }
