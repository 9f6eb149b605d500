"""The communication model's fit: exposed all-reduce time against message size, replicas and nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.fitting.lsq import GAMMA_BOUNDS, LOSS_SCALE, multi_start_lsq
from sim.hardware import ComputeParams, smooth_max
from sim.network import CommParams

# --------------------------------------------------------------------------------------------
# Communication model
# --------------------------------------------------------------------------------------------


@dataclass
class CommFitReport:
    """Diagnostics of one communication fit."""

    n_rows: int
    n_rows_intra: int
    n_rows_inter: int
    fit_mape: float  # step time, in-sample mean abs. percentage error
    fit_mdape: float  # step time, median
    exposed_mape: float  # exposed comm (step - compute) vs measured sync_time_s, mean APE
    exposed_mdape: float
    exposed_mae_s: float  # mean abs. error of the exposed comm, seconds
    notes: list[str] = field(default_factory=list)


def _sync_time(p: np.ndarray, replicas: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    a_in, b_in, a_out, b_out = p[:4]
    r2 = replicas - 2.0
    return np.where(nodes > 1, a_out + b_out * r2, a_in + b_in * r2)


def fit_comm_report(table_for_pair: pd.DataFrame, compute: ComputeParams) -> tuple[CommParams, CommFitReport]:
    """:func:`fit_comm` plus its diagnostics (see there for the arguments)."""
    d = table_for_pair[table_for_pair["num_gpus"] > 1]
    notes: list[str] = []
    if d.empty:
        raise ValueError(
            f"{compute.gpu}/{compute.app}: no multi-GPU rows (num_gpus > 1) to fit the communication model"
        )
    b = d["local_batch"].to_numpy(np.float64)
    replicas = d["num_gpus"].to_numpy(np.float64)
    nodes = d["num_nodes"].to_numpy(np.float64)
    step = d["step_time_s"].to_numpy(np.float64)
    sync = d["sync_time_s"].to_numpy(np.float64)
    inter = nodes > 1
    has_intra, has_inter = bool((~inter).any()), bool(inter.any())
    if not has_intra:
        notes.append("no single-node multi-GPU rows: intra-node parameters copied from inter-node")
    if not has_inter:
        notes.append("no multi-node rows: inter-node parameters copied from intra-node")

    # Compute time under the fitted model (gpu part and host floor, no slow-down).
    t_comp = smooth_max(compute.host_s, compute.alpha_s + compute.beta_s * b**compute.exponent, compute.k)
    ts = float(np.median(step))
    tc, y = t_comp / ts, step / ts
    log_y = np.log(y)

    def expand(q: np.ndarray) -> np.ndarray:
        # Parameters actually fitted -> (a_in, b_in, a_out, b_out, gamma).
        if has_intra and has_inter:
            return q
        return np.array([q[0], q[1], q[0], q[1], q[2]])

    def residuals(q: np.ndarray) -> np.ndarray:
        p = expand(q)
        return np.log(smooth_max(tc, _sync_time(p, replicas, nodes), p[4])) - log_y

    def init(mask: np.ndarray) -> tuple[float, float]:
        if not mask.any():
            return 0.1, 0.01
        s = sync[mask] / ts
        r = replicas[mask]
        a = float(np.median(s[r == r.min()]))
        slope = np.polyfit(r - 2.0, s, 1)[0] if np.unique(r).size >= 2 else 0.0
        return max(a, 1e-3), max(float(slope), 1e-4)

    ai, bi = init(~inter)
    ao, bo = init(inter)
    if has_intra and has_inter:
        starts_base = [ai, bi, ao, bo]
    elif has_intra:
        starts_base = [ai, bi]
    else:
        starts_base = [ao, bo]
    n_lin = len(starts_base)
    lower = [0.0] * n_lin + [GAMMA_BOUNDS[0]]
    upper = [np.inf] * n_lin + [GAMMA_BOUNDS[1]]
    best = multi_start_lsq(
        residuals,
        (
            np.asarray([v * scale for v in starts_base] + [g0])
            for g0 in (1.5, 4.0, 12.0)
            for scale in (1.0, 0.5)
        ),
        bounds=(lower, upper),
        loss="soft_l1",
        f_scale=LOSS_SCALE,
        x_scale="jac",
        max_nfev=4000,
    )
    p = expand(best.x)
    params = CommParams(
        gpu=compute.gpu,
        app=compute.app,
        alpha_intra_s=float(p[0] * ts),
        beta_intra_s=float(p[1] * ts),
        alpha_inter_s=float(p[2] * ts),
        beta_inter_s=float(p[3] * ts),
        gamma=float(p[4]),
    )
    t_sync = _sync_time(
        np.array([params.alpha_intra_s, params.beta_intra_s, params.alpha_inter_s, params.beta_inter_s]),
        replicas,
        nodes,
    )
    pred = smooth_max(t_comp, t_sync, params.gamma)
    ape = np.abs(pred / step - 1.0)
    exposed_pred = pred - t_comp
    exposed_err = np.abs(exposed_pred - sync)
    measured = sync > 0  # a percentage of a zero sync time is undefined: those rows are skipped
    exposed_ape = exposed_err[measured] / sync[measured] if measured.any() else np.array([np.nan])
    params = CommParams(**{**params.__dict__, "fit_mape": float(ape.mean())})
    report = CommFitReport(
        n_rows=len(d),
        n_rows_intra=int((~inter).sum()),
        n_rows_inter=int(inter.sum()),
        fit_mape=float(ape.mean()),
        fit_mdape=float(np.median(ape)),
        exposed_mape=float(exposed_ape.mean()),
        exposed_mdape=float(np.median(exposed_ape)),
        exposed_mae_s=float(exposed_err.mean()),
        notes=notes,
    )
    return params, report


def fit_comm(table_for_pair: pd.DataFrame, compute: ComputeParams) -> CommParams:
    """Fit Pollux's all-reduce model of one (gpu, app) to its multi-GPU step times.

    Predicted step time = smooth_max(T_compute(b), T_sync(R, nodes), gamma) with
    T_sync = alpha + beta * (R - 2), separate (alpha, beta) for one node and for several nodes.
    ``least_squares`` on log step time (relative error), soft_l1 loss, all alpha/beta >= 0,
    gamma in :data:`GAMMA_BOUNDS`. A pair measured on one node only gets inter-node parameters
    equal to the intra-node ones (and vice versa), noted in :func:`fit_comm_report`.

    Args:
        table_for_pair: validated rows of one (gpu, app); rows with ``num_gpus == 1`` are ignored.
        compute: the pair's fitted compute model.

    Returns:
        The fitted :class:`CommParams` with ``fit_mape`` = in-sample MAPE of the step time.
    """
    return fit_comm_report(table_for_pair, compute)[0]


def refit_comm_intra(
    local_batch: np.ndarray | list[float],
    step_time_s: np.ndarray | list[float],
    replicas: int,
    compute: ComputeParams,
    stored: CommParams,
) -> tuple[CommParams, dict[str, float | bool]]:
    """Refit the one-node all-reduce latency ``alpha_intra_s`` and the overlap ``gamma`` of
    ``stored`` to step times measured on one node at one replica count (a quick ladder: every one
    of ``replicas`` ranks at each of ``local_batch``), the compute model ``compute`` (already
    refitted on the same ladder) taken as given.

    One replica count cannot tell the latency from the per-replica term, so ``beta_intra_s`` is
    kept, as are the inter-node parameters (no node boundary was crossed). ``least_squares`` on log
    step time as :func:`fit_comm_report`, with the stored pair among the starts; the stored pair is
    kept when the fit does not lower the step-time MAPE on the ladder (``kept_stored``).

    Returns:
        The refitted :class:`CommParams` (``fit_mape``: its MAPE on the ladder; ``stored`` itself
        when kept) and the figures:
        ``mape_before`` (the stored pair), ``mape_after``, ``kept_stored``.

    Raises:
        ValueError: fewer than two batches, lengths that differ, non-positive times, or
            ``replicas < 2`` (one rank has no all-reduce to refit).
    """
    b = np.asarray(local_batch, dtype=np.float64)
    step = np.asarray(step_time_s, dtype=np.float64)
    if b.shape != step.shape or b.ndim != 1 or b.size < 2:
        raise ValueError(
            f"refit_comm_intra needs >= 2 (local batch, step time) pairs of equal length, got {b.size} batches "
            f"and {step.size} step times"
        )
    if not (np.isfinite(step).all() and (step > 0).all()):
        raise ValueError(f"refit_comm_intra: step times must be finite and > 0 s, got {step.tolist()}")
    if isinstance(replicas, bool) or not isinstance(replicas, int | np.integer) or replicas < 2:
        raise ValueError(
            f"refit_comm_intra: replicas must be an integer >= 2 (an all-reduce), got {replicas!r}"
        )
    from sim.hardware import ComputeModel

    t_comp = ComputeModel(compute).compute_time_s(b)
    ts = float(np.median(step))
    tc, log_y = t_comp / ts, np.log(step / ts)
    fixed = stored.beta_intra_s * (replicas - 2) / ts

    def predict(q: np.ndarray) -> np.ndarray:
        return smooth_max(tc, q[0] + fixed, q[1])

    def residuals(q: np.ndarray) -> np.ndarray:
        return np.log(predict(q)) - log_y

    def mape(q: np.ndarray) -> float:
        return float(np.mean(np.abs(predict(q) * ts / step - 1.0)))

    exposed = float(np.median(np.maximum(step - t_comp, 1e-3 * ts))) / ts
    before = np.array([stored.alpha_intra_s / ts, stored.gamma])
    starts = [before] + [np.array([max(exposed * s, 1e-4), g]) for g in (1.0, 2.0, 8.0) for s in (1.0, 0.5)]
    best = multi_start_lsq(
        residuals,
        (np.clip(x, [0.0, GAMMA_BOUNDS[0]], [np.inf, GAMMA_BOUNDS[1]]) for x in starts),
        bounds=([0.0, GAMMA_BOUNDS[0]], [np.inf, GAMMA_BOUNDS[1]]),
        loss="soft_l1",
        f_scale=LOSS_SCALE,
        x_scale="jac",
        max_nfev=4000,
    )
    mape_before, mape_after = mape(before), mape(best.x)
    kept = not mape_after < mape_before
    params = (
        stored
        if kept
        else CommParams(
            **{
                **stored.__dict__,
                "alpha_intra_s": float(best.x[0] * ts),
                "gamma": float(best.x[1]),
                "fit_mape": mape_after,
            }
        )
    )
    return params, {
        "mape_before": mape_before,
        "mape_after": min(mape_before, mape_after),
        "kept_stored": kept,
    }
