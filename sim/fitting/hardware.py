"""Fitting the compute and communication models to measured step times.

The measured table (``sim/data/reference/throughput_profiles.csv``, or a user's own table in the
same format) has one row per (GPU type, application, placement, local batch). From it:

* compute time per (gpu, app, local batch) = the one-GPU step time (placement ``1``, i.e.
  ``num_gpus == 1``), ``step_time_s`` as measured, its ~0.3-14 ms ``sync_time_s`` NOT subtracted:
  in the simulator a one-replica job has ``T_sync = 0``, so ``T_iter = T_compute`` must reproduce
  the one-GPU step time, and the leave-one-out error is then the error of the step time itself.
  A pair with fewer than :data:`MIN_ONE_GPU_BATCHES` one-GPU batch sizes falls back to the median
  over all placements of ``step_time_s - sync_time_s`` and is flagged (:func:`compute_source`).
  That median is always computed too, as a check (:func:`single_gpu_check`): where the two
  differ (V100 cifar10 / ncf) a per-step host floor is booked inside ``sync_time_s`` in the
  multi-GPU rows, and the one-GPU step time is the one that holds it;
* :func:`fit_compute` fits :class:`sim.hardware.ComputeParams`,
  ``T_compute(b) = smooth_max(host_s, alpha_s + beta_s * b ** exponent, k)``, on log residuals
  (relative error) with a robust loss; the exponent is either fixed at 1 or free in
  :data:`EXPONENT_BOUNDS`, whichever has the lower leave-one-batch-size-out error
  (:data:`EXPONENT_RULE`); for the pairs of :data:`HOST_FLOOR_PAIRS` ``alpha_s`` is held at 0 so
  the whole fixed per-step cost lands in ``host_s`` (:data:`HOST_FLOOR_RULE`);
* :func:`fit_comm` fits :class:`sim.network.CommParams` (Pollux's all-reduce model) to the step
  times of all multi-GPU rows, given the compute model;
* :func:`fit_all` does both for every (gpu, app) pair of a table.

Everything is deterministic: fixed initial guesses, no random restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.fitting.comm import fit_comm_report
from sim.fitting.lsq import EXPONENT_BOUNDS, K_BOUNDS, LOSS_SCALE, multi_start_lsq
from sim.fitting.table import (
    MIN_ONE_GPU_BATCHES,
    SOURCE_ONE_GPU,
    SOURCE_PLACEMENT_MEDIAN,
    compute_source,
    compute_times,
    read_profile_table,
    single_gpu_check,
)
from sim.hardware import ComputeParams, smooth_max
from sim.network import CommParams

logger = logging.getLogger(__name__)

#: A free exponent is kept only if it lowers the LOO MdAPE by at least this fraction of the
#: fixed-exponent LOO MdAPE (10 % relative). Otherwise the simpler exponent = 1 model is used.
EXPONENT_MIN_GAIN = 0.10
EXPONENT_RULE = (
    f"exponent fixed at 1 unless a free exponent in [{EXPONENT_BOUNDS[0]}, {EXPONENT_BOUNDS[1]}] "
    "lowers the leave-one-batch-size-out MdAPE by at least "
    f"{EXPONENT_MIN_GAIN:.0%} (relative)"
)
#: Pairs whose fixed per-step cost is host / input-pipeline overhead, not GPU work: the V100 VMs'
#: ~0.09-0.10 s floor on the small models (sim/data/reference/README.md). Their fit holds
#: alpha_s = 0 so that the floor is host_s, which the simulator stretches under CPU interference
#: and counts as host time, and which a FLOP-scaled workload does not scale. With the host floor
#: inactive (h ~ 0) the data cannot tell the two apart (h + beta*b**e with k = 1 equals
#: alpha + beta*b**e exactly), so this is an attribution, not a loss of fit.
HOST_FLOOR_PAIRS: tuple[tuple[str, str], ...] = (("V100", "cifar10"), ("V100", "ncf"))
HOST_FLOOR_RULE = (
    "alpha_s held at 0 (the fixed per-step cost is the host floor host_s) for the pairs whose "
    "floor is known host / input-pipeline overhead"
)
COMPUTE_EQUATION = (
    "T_compute(b) = (host_s**k + (alpha_s + beta_s * b**exponent)**k)**(1/k); "
    "b = local batch, fitted to the one-GPU step_time_s per batch (fallback where a pair has no "
    "one-GPU rows: median over placements of step_time_s - sync_time_s)"
)
COMM_EQUATION = (
    "T_step = (T_compute(b)**gamma + T_sync**gamma)**(1/gamma); "
    "T_sync = alpha_intra_s + beta_intra_s*(R-2) on one node, "
    "alpha_inter_s + beta_inter_s*(R-2) across nodes; fitted to step_time_s of multi-GPU rows"
)


# --------------------------------------------------------------------------------------------
# Compute model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CurveFit:
    """A fitted compute curve in seconds, with the robust cost it reached."""

    alpha_s: float
    beta_s: float
    exponent: float
    host_s: float
    k: float
    cost: float

    def predict(self, local_batch: np.ndarray) -> np.ndarray:
        b = np.asarray(local_batch, dtype=np.float64)
        return smooth_max(self.host_s, self.alpha_s + self.beta_s * b**self.exponent, self.k)


def _as_xy(local_batch: Sequence[float] | np.ndarray, compute_time_s: Sequence[float] | np.ndarray):
    b = np.asarray(local_batch, dtype=np.float64).reshape(-1)
    t = np.asarray(compute_time_s, dtype=np.float64).reshape(-1)
    if b.shape != t.shape:
        raise ValueError(f"local_batch ({b.size}) and compute_time_s ({t.size}) differ in length")
    if b.size < 2:
        raise ValueError(f"fitting a compute model needs at least 2 batch sizes, got {b.size}")
    if not (np.all(np.isfinite(b)) and np.all(b >= 1)):
        raise ValueError("local_batch must be finite and >= 1 everywhere")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError("compute_time_s must be finite and > 0 everywhere")
    order = np.argsort(b, kind="stable")
    return b[order], t[order]


def _fit_curve(
    b: np.ndarray, t: np.ndarray, exponent: float | None, alpha_zero: bool = False, additive: bool = False
) -> _CurveFit:
    """Least-squares fit of the compute curve; ``exponent=None`` leaves the exponent free,
    ``alpha_zero`` holds alpha_s at 0 (the fixed per-step cost is then the host floor alone) and
    ``additive`` holds host_s at 0 and k at 1 (``T = alpha_s + beta_s * b**exponent``, the
    floor-free model of :data:`sim.fitting.step_time.ADDITIVE_RULE`, fitted without the
    analytic Jacobian).

    Works in normalised units (times over their median, batches over the largest), so every
    parameter is O(1): T/ts = smooth_max(h, a + c * (b / bmax) ** e, k).
    """
    ts = float(np.median(t))
    bmax = float(b.max())
    x, y = b / bmax, t / ts
    log_y = np.log(y)
    log_x = np.log(x)
    free = exponent is None
    if additive:
        names: tuple[str, ...] = ("a", "c") + (("e",) if free else ())
    else:
        names = (() if alpha_zero else ("a",)) + ("c",) + (("e",) if free else ()) + ("h", "k")

    def unpack(p: np.ndarray) -> tuple[float, float, float, float, float]:
        v = dict(zip(names, p, strict=True))
        e = v["e"] if free else float(exponent)
        return v.get("a", 0.0), v["c"], e, v.get("h", 0.0), v.get("k", 1.0)

    def residuals(p: np.ndarray) -> np.ndarray:
        a, c, e, h, k = unpack(p)
        return np.log(smooth_max(h, a + c * x**e, k)) - log_y

    def jacobian(p: np.ndarray) -> np.ndarray:
        # log S = log m + log(w_h + w_g) / k with m = max(h, g), w_* = (*/m)**k.
        a, c, e, h, k = unpack(p)
        xe = x**e
        g = a + c * xe
        m = np.maximum(g, h)
        rh, rg = h / m, g / m
        w_h, w_g = rh**k, rg**k
        u = w_h + w_g
        d_g = rg ** (k - 1.0) / (m * u)  # d log S / d g
        d_h = rh ** (k - 1.0) / (m * u)
        log_rh = np.log(np.where(rh > 0, rh, 1.0))
        d_k = -np.log(u) / k**2 + (w_h * log_rh + w_g * np.log(rg)) / (k * u)
        cols = {"a": d_g, "c": d_g * xe, "e": d_g * c * xe * log_x, "h": d_h, "k": d_k}
        return np.column_stack([cols[n] for n in names])

    exponents = (0.75, 1.0, 1.25) if free else (float(exponent),)
    low = {"a": 0.0, "c": 1e-9, "e": EXPONENT_BOUNDS[0], "h": 0.0, "k": K_BOUNDS[0]}
    high = {"a": np.inf, "c": np.inf, "e": EXPONENT_BOUNDS[1], "h": np.inf, "k": K_BOUNDS[1]}
    lo, hi = [low[n] for n in names], [high[n] for n in names]
    if additive:
        # Initial guesses: the straight line through all batches and (half the fastest step,
        # the slowest step), crossed with exponents.
        slope, intercept = np.polyfit(x, y, 1)
        ac0 = [
            (max(float(intercept), 1e-3), max(float(slope), 1e-3)),
            (0.5 * float(np.min(y)), float(np.max(y))),
        ]
        starts = [{"a": a0, "c": c0, "e": e0} for a0, c0 in ac0 for e0 in exponents]
        options: dict[str, Any] = {}
    else:
        # Initial guesses: a straight line through the upper half of the batches (GPU-bound part),
        # crossed with exponents, sharpness values and "no host floor" / "floor at the fastest step".
        upper = x >= np.median(x)
        slope, intercept = np.polyfit(x[upper], y[upper], 1) if upper.sum() >= 2 else (y[-1], 0.0)
        c0 = max(float(slope), 0.1 * float(y.max()))
        a0 = float(np.clip(intercept, 1e-3, 0.9 * y.min()))
        starts = [
            {"a": a0, "c": c0, "e": e0, "h": h0, "k": k0}
            for e0 in exponents
            for k0 in (3.0, 16.0)
            for h0 in (1e-3, 0.95 * float(y.min()))
        ]
        options = {"jac": jacobian, "max_nfev": 500}
    best = multi_start_lsq(
        residuals,
        (np.clip([st[n] for n in names], lo, hi) for st in starts),
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=LOSS_SCALE,
        x_scale="jac",
        **options,
    )
    a, c, e, h, k = unpack(best.x)
    return _CurveFit(
        alpha_s=a * ts,
        beta_s=c * ts / bmax**e,
        exponent=e,
        host_s=h * ts,
        k=k,
        cost=float(best.cost),
    )


def loo_mdape(
    local_batch: Sequence[float] | np.ndarray,
    compute_time_s: Sequence[float] | np.ndarray,
    exponent: float | None = 1.0,
    alpha_zero: bool = False,
    additive: bool = False,
) -> tuple[float, dict[int, float]]:
    """Leave-one-batch-size-out error of the compute model.

    For each distinct local batch, fit on the other batches and predict it.

    Args:
        local_batch: distinct local batch sizes (one compute time each).
        compute_time_s: compute time per batch, seconds.
        exponent: fixed exponent, or ``None`` to fit it freely in :data:`EXPONENT_BOUNDS`.
        alpha_zero: hold alpha_s at 0 (see :data:`HOST_FLOOR_PAIRS`).
        additive: hold host_s at 0 and k at 1 (the floor-free model, see :func:`_fit_curve`).

    Returns:
        (median absolute percentage error as a fraction, {batch: abs. percentage error}).
    """
    b, t = _as_xy(local_batch, compute_time_s)
    if len(np.unique(b)) != b.size:
        raise ValueError("loo_mdape needs one compute time per distinct local batch")
    if b.size < 3:
        raise ValueError(f"leave-one-out needs at least 3 batch sizes, got {b.size}")
    errors: dict[int, float] = {}
    for i in range(b.size):
        keep = np.arange(b.size) != i
        fit = _fit_curve(b[keep], t[keep], exponent, alpha_zero, additive)
        pred = float(fit.predict(b[i : i + 1])[0])
        errors[int(b[i])] = abs(pred / t[i] - 1.0)
    return float(np.median(list(errors.values()))), errors


@dataclass
class ComputeFitReport:
    """Diagnostics of one compute fit (what :func:`fit_compute_report` returns next to the model)."""

    exponent_mode: str  # "fixed" or "free"
    loo_mdape_fixed: float
    loo_mdape_free: float
    loo_per_batch: dict[int, float]
    residuals: dict[int, float] = field(default_factory=dict)  # in-sample pred/obs - 1


def fit_compute_report(
    local_batch: Sequence[float] | np.ndarray,
    compute_time_s: Sequence[float] | np.ndarray,
    gpu: str,
    app: str,
    max_batch: int | None = None,
    exponent: float | str | None = "auto",
    alpha_zero: bool = False,
    additive: bool = False,
) -> tuple[ComputeParams, ComputeFitReport]:
    """:func:`fit_compute` plus its diagnostics (see there for the arguments; ``additive`` holds
    host_s at 0 and k at 1, the floor-free model of :func:`sim.fitting.step_time.fit_compute_additive`)."""
    b, t = _as_xy(local_batch, compute_time_s)
    if exponent == "auto":
        if b.size >= 3:
            fixed_err, fixed_per = loo_mdape(b, t, 1.0, alpha_zero, additive)
            free_err, free_per = loo_mdape(b, t, None, alpha_zero, additive)
        else:
            fixed_err = free_err = float("nan")
            fixed_per = free_per = {}
        use_free = bool(free_err <= (1.0 - EXPONENT_MIN_GAIN) * fixed_err)
        chosen: float | None = None if use_free else 1.0
        loo, per = (free_err, free_per) if use_free else (fixed_err, fixed_per)
    elif exponent is None or isinstance(exponent, int | float):
        chosen = None if exponent is None else float(exponent)
        if b.size >= 3:
            loo, per = loo_mdape(b, t, chosen, alpha_zero, additive)
        else:
            loo, per = float("nan"), {}
        fixed_err = loo if chosen is not None else float("nan")
        free_err = loo if chosen is None else float("nan")
    else:
        raise ValueError(f"exponent must be 'auto', None (free) or a number, got {exponent!r}")

    fit = _fit_curve(b, t, chosen, alpha_zero, additive)
    pred = fit.predict(b)
    rel = pred / t - 1.0
    params = ComputeParams(
        gpu=gpu,
        app=app,
        alpha_s=fit.alpha_s,
        beta_s=fit.beta_s,
        exponent=fit.exponent,
        host_s=fit.host_s,
        k=fit.k,
        max_batch=int(max_batch if max_batch is not None else b.max()),
        loo_mdape=loo,
        fit_mape=float(np.mean(np.abs(rel))),
    )
    report = ComputeFitReport(
        exponent_mode="free" if chosen is None else "fixed",
        loo_mdape_fixed=fixed_err,
        loo_mdape_free=free_err,
        loo_per_batch=per,
        residuals={int(bb): float(r) for bb, r in zip(b, rel, strict=True)},
    )
    return params, report


def fit_compute(
    local_batch: Sequence[float] | np.ndarray,
    compute_time_s: Sequence[float] | np.ndarray,
    gpu: str,
    app: str,
    max_batch: int | None = None,
    exponent: float | str | None = "auto",
    alpha_zero: bool = False,
) -> ComputeParams:
    """Fit ``T_compute(b) = smooth_max(host_s, alpha_s + beta_s * b ** exponent, k)``.

    ``scipy.optimize.least_squares`` on log residuals (relative error), soft_l1 loss with scale
    :data:`LOSS_SCALE`, bounds alpha_s >= 0, beta_s > 0, host_s >= 0, k in :data:`K_BOUNDS`,
    exponent in :data:`EXPONENT_BOUNDS` when free; several fixed initial guesses, the lowest
    cost wins. With ``exponent="auto"`` the rule :data:`EXPONENT_RULE` picks fixed or free.

    Args:
        local_batch: distinct local batch sizes.
        compute_time_s: compute time per local batch, seconds.
        gpu: GPU type, stored in the result.
        app: application, stored in the result.
        max_batch: memory cap stored in the result; defaults to the largest batch given.
        exponent: ``"auto"`` (choose by LOO), ``None`` (free) or a fixed value.
        alpha_zero: hold ``alpha_s`` at 0, so the fixed per-step cost is the host floor
            ``host_s`` (:data:`HOST_FLOOR_RULE`); the LOO error is that of the held model.

    Returns:
        The fitted :class:`ComputeParams`, with ``loo_mdape`` (of the chosen exponent mode) and
        the in-sample ``fit_mape``.
    """
    return fit_compute_report(local_batch, compute_time_s, gpu, app, max_batch, exponent, alpha_zero)[0]


# --------------------------------------------------------------------------------------------
# All pairs
# --------------------------------------------------------------------------------------------


def fit_all(
    table: pd.DataFrame | str | Path,
    host_floor_pairs: Collection[tuple[str, str]] = HOST_FLOOR_PAIRS,
) -> tuple[list[ComputeParams], list[CommParams], dict[tuple[str, str], dict[str, Any]]]:
    """Fit compute and communication models for every (gpu, app) pair of a profile table.

    Compute: fitted to the pair's one-GPU step times (fallback, flagged in the diagnostics: the
    median over placements of step - sync); communication: fitted to the multi-GPU step times
    with that compute model held fixed.

    Args:
        table: a profile table (validated by :func:`read_profile_table`) or its path.
        host_floor_pairs: (gpu, app) pairs fitted with ``alpha_s = 0`` (:data:`HOST_FLOOR_RULE`);
            pairs named here but absent from the table are ignored.

    Returns:
        (compute models, communication models, diagnostics keyed by (gpu, app)), sorted by
        (gpu, app). A pair without multi-GPU rows has no communication model.
    """
    df = read_profile_table(table)
    floor_pairs = {(str(g), str(a)) for g, a in host_floor_pairs}
    computes: list[ComputeParams] = []
    comms: list[CommParams] = []
    diagnostics: dict[tuple[str, str], dict[str, Any]] = {}
    for (gpu, app), pair in df.groupby(["gpu", "app"], sort=True):
        key = (str(gpu), str(app))
        times = compute_times(pair)
        source = compute_source(times)
        used = times.dropna(subset=["compute_time_s"])
        alpha_zero = key in floor_pairs
        params, rep = fit_compute_report(
            used["local_batch"],
            used["compute_time_s"],
            key[0],
            key[1],
            max_batch=int(times["local_batch"].max()),
            alpha_zero=alpha_zero,
        )
        diag: dict[str, Any] = {
            "compute_source": source,
            "compute_fallback": source != SOURCE_ONE_GPU,
            "alpha_held_zero": alpha_zero,
            "n_batches": len(used),
            "n_batches_measured": len(times),
            "n_rows": len(pair),
            "n_placements": int(pair["placement"].nunique()) if "placement" in pair else None,
            "min_measured_batch": int(times["local_batch"].min()),
            "exponent_mode": rep.exponent_mode,
            "loo_mdape_fixed": rep.loo_mdape_fixed,
            "loo_mdape_free": rep.loo_mdape_free,
            "loo_per_batch": rep.loo_per_batch,
            "residual_per_batch": rep.residuals,
            "single_gpu_check": single_gpu_check(times),
            "single_gpu_step_mape": _single_gpu_step_mape(pair, params),
        }
        computes.append(params)
        if source != SOURCE_ONE_GPU:
            logger.warning(
                "%s/%s: fewer than %d batch sizes with a one-GPU row; compute fitted to the %s",
                gpu,
                app,
                MIN_ONE_GPU_BATCHES,
                SOURCE_PLACEMENT_MEDIAN,
            )
        logger.info("%s/%s compute: LOO MdAPE %.1f%%", gpu, app, 100 * params.loo_mdape)
        if (pair["num_gpus"] > 1).any():
            comm, crep = fit_comm_report(pair, params)
            comms.append(comm)
            diag["comm"] = crep.__dict__
        else:
            diag["comm"] = None
        diagnostics[key] = diag
    return computes, comms, diagnostics


def _single_gpu_step_mape(pair: pd.DataFrame, compute: ComputeParams) -> float:
    """Mean abs. percentage error of T_compute against the one-GPU step times (NaN if none)."""
    one = pair[pair["num_gpus"] == 1]
    if one.empty:
        return float("nan")
    b = one["local_batch"].to_numpy(np.float64)
    pred = smooth_max(compute.host_s, compute.alpha_s + compute.beta_s * b**compute.exponent, compute.k)
    return float(np.mean(np.abs(pred / one["step_time_s"].to_numpy() - 1.0)))
