"""Step-time fits of a calibrated profile: the floor-free (additive) compute model for CPU ranks,
the fit of a profile's measured table and the held-out check of the fitted step times."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sim.hardware import ComputeModel, ComputeParams
from sim.network import CommModel, CommParams
from sim.validation import check_int

# --------------------------------------------------------------------------------------------
# Fitting: sim.fitting.hardware's fits, with a floor-free compute model for CPU ranks
# --------------------------------------------------------------------------------------------

#: Why some worker types are fitted without a host floor (``additive_types``).
ADDITIVE_RULE = (
    "host_s held at 0 (T_compute = alpha_s + beta_s * b**exponent) for worker types whose whole step runs "
    "on the device that a slow-down slows: a CPU rank slices its input, runs forward and backward on the "
    "same core, and the real adapter emulates a slower worker by stretching all of it, so no part of the "
    "fixed cost may escape the simulator's gpu_slowdown"
)


def fit_compute_additive(
    local_batch: Sequence[float],
    compute_time_s: Sequence[float],
    gpu: str,
    app: str,
    max_batch: int | None = None,
) -> tuple[ComputeParams, dict[str, Any]]:
    """Fit ``T_compute(b) = alpha_s + beta_s * b ** exponent`` with ``host_s = 0`` (:data:`ADDITIVE_RULE`),
    the exponent fixed at 1 or free by :data:`sim.fitting.hardware.EXPONENT_RULE` (leave-one-batch-size-out):
    :func:`sim.fitting.hardware.fit_compute_report` with ``additive=True``."""
    from sim.fitting.hardware import fit_compute_report

    b = np.asarray(local_batch, dtype=np.float64)
    t = np.asarray(compute_time_s, dtype=np.float64)
    if b.size < 2 or np.any(t <= 0) or np.any(b < 1):
        raise ValueError(f"{gpu}/{app}: fitting a compute model needs >= 2 batch sizes >= 1 with times > 0")
    params, rep = fit_compute_report(b, t, gpu, app, max_batch, additive=True)
    report = {
        "exponent_mode": rep.exponent_mode,
        "loo_mdape_fixed": rep.loo_mdape_fixed,
        "loo_mdape_free": rep.loo_mdape_free,
        "loo_per_batch": rep.loo_per_batch,
        "residual_per_batch": rep.residuals,
        "host_floor": ADDITIVE_RULE,
    }
    return params, report


def fit_models(
    table: Any, additive_types: Sequence[str] = (), host_floor_pairs: Sequence[tuple[str, str]] = ()
) -> tuple[list[ComputeParams], list[CommParams], dict[tuple[str, str], dict[str, Any]]]:
    """:func:`sim.fitting.hardware.fit_all`, except that worker types in ``additive_types`` get
    :func:`fit_compute_additive` (and their all-reduce model refitted to it with
    :func:`sim.fitting.comm.fit_comm_report`)."""
    from sim.fitting.comm import fit_comm_report
    from sim.fitting.hardware import fit_all
    from sim.fitting.table import compute_times, read_profile_table

    df = read_profile_table(table)
    computes, comms, diags = fit_all(df, host_floor_pairs)
    add = set(additive_types)
    if not add:
        return computes, comms, diags
    cmap = {(p.gpu, p.app): p for p in computes}
    nmap = {(p.gpu, p.app): p for p in comms}
    for (gpu, app), pair in df.groupby(["gpu", "app"], sort=True):
        if gpu not in add:
            continue
        times = compute_times(pair).dropna(subset=["compute_time_s"])
        params, rep = fit_compute_additive(
            times["local_batch"], times["compute_time_s"], str(gpu), str(app), int(pair["local_batch"].max())
        )
        cmap[(gpu, app)] = params
        diags[(gpu, app)].update(rep, alpha_held_zero=False)
        if (pair["num_gpus"] > 1).any():
            comm, crep = fit_comm_report(pair, params)
            nmap[(gpu, app)] = comm
            diags[(gpu, app)]["comm"] = crep.__dict__
    return [cmap[k] for k in sorted(cmap)], [nmap[k] for k in sorted(nmap)], diags


# --------------------------------------------------------------------------------------------
# Step-time predictions and the held-out check
# --------------------------------------------------------------------------------------------


def step_time_s(
    compute: ComputeParams,
    comm: CommParams | None,
    local_batch: np.ndarray | float,
    replicas: int,
    nodes: int = 1,
) -> np.ndarray:
    """The simulator's noise-free step time with every one of ``replicas`` workers at ``local_batch``:
    ``smooth_max_gamma(T_compute(b), T_sync(R, nodes))`` (``T_compute`` alone for one replica)."""
    t_comp = ComputeModel(compute).compute_time_s(local_batch)
    if replicas <= 1 or comm is None:
        return np.asarray(t_comp, dtype=np.float64)
    model = CommModel([comm], replicas, nodes, model_bytes=0.0)
    return model.iteration_time_s(t_comp, model.sync_time_s())


def holdout_split(table: Any, every: int = 2) -> tuple[Any, Any]:
    """Split a validated profile table by local batch: per (gpu, app), of the distinct batches in
    ascending order, every ``every``-th starting with the second is held out, except the largest
    (so held-out batches are interpolated, never extrapolated). Returns (fit rows, held-out rows)."""
    check_int("holdout every", every, 2)
    held = np.zeros(len(table), dtype=bool)
    for _, pair in table.groupby(["gpu", "app"], sort=True):
        batches = np.sort(pair["local_batch"].unique())
        out = set(batches[1:-1:every].tolist())
        held[pair.index[pair["local_batch"].isin(out)]] = True
    return table[~held].reset_index(drop=True), table[held].reset_index(drop=True)


def holdout_errors(
    table: Any,
    every: int = 2,
    host_floor_pairs: Sequence[tuple[str, str]] = (),
    additive_types: Sequence[str] = (),
) -> dict[str, Any]:
    """Fit on part of the batch ladder and predict the rest (see :func:`holdout_split`).

    The fit is :func:`fit_models` on the kept rows; every held-out row's step time is predicted
    with :func:`step_time_s`.

    Returns:
        ``rows`` (one dict per held-out row: gpu, app, workers, local batch, measured and
        predicted step time, APE) and ``mdape`` per worker type (a fraction), plus the pooled
        ``mdape_all``.
    """
    from sim.fitting.table import read_profile_table

    df = read_profile_table(table)
    fit_rows, test_rows = holdout_split(df, every)
    if test_rows.empty:
        raise ValueError(
            "the batch ladder is too short to hold batches out: it needs at least 3 local batches per pair"
        )
    computes, comms, _ = fit_models(fit_rows, additive_types, host_floor_pairs)
    cmap = {(p.gpu, p.app): p for p in computes}
    nmap = {(p.gpu, p.app): p for p in comms}
    rows = []
    for r in test_rows.itertuples(index=False):
        key = (r.gpu, r.app)
        pred = float(step_time_s(cmap[key], nmap.get(key), r.local_batch, int(r.num_gpus), int(r.num_nodes)))
        rows.append({
            "gpu": r.gpu, "app": r.app, "workers": int(r.num_gpus), "nodes": int(r.num_nodes),
            "local_batch": int(r.local_batch), "measured_s": float(r.step_time_s), "predicted_s": pred,
            "ape": abs(pred / float(r.step_time_s) - 1.0),
        })  # fmt: skip
    by_gpu: dict[str, list[float]] = {}
    for row in rows:
        by_gpu.setdefault(row["gpu"], []).append(row["ape"])
    return {
        "rows": rows,
        "mdape": {g: float(np.median(v)) for g, v in sorted(by_gpu.items())},
        "mdape_all": float(np.median([r["ape"] for r in rows])),
        "fit_batches": sorted({int(b) for b in fit_rows["local_batch"]}),
        "held_out_batches": sorted({int(b) for b in test_rows["local_batch"]}),
        "fit": {"compute": computes, "comm": comms},
    }


#: When :func:`fit_compute_knee` keeps a knee.
KNEE_RULE = (
    "a knee (an extra per-sample cost past a local batch: the working set out of cache) is kept when "
    "it lowers the robust relative error of the exponent-1 additive model by at least a third, with a "
    "measured batch past it (its slope is then that batch's excess over the line below the knee)"
)


def fit_compute_knee(
    local_batch: Sequence[float],
    compute_time_s: Sequence[float],
    gpu: str,
    app: str,
    max_batch: int | None = None,
) -> tuple[ComputeParams, dict[str, Any]]:
    """``T(b) = alpha_s + beta_s * b + knee_beta_s * max(0, b - knee_batch)`` (host_s = 0, exponent 1)
    by robust least squares on relative error (scipy, soft-L1), the knee on a grid between the
    measured batches, or no knee at all by :data:`KNEE_RULE`. Repeated batches are separate rows
    (a ladder beside a campaign's medians). Returns the parameters and the fit's figures (relative
    residual per row, with and without the knee)."""
    from scipy.optimize import least_squares

    b = np.asarray(local_batch, dtype=np.float64)
    t = np.asarray(compute_time_s, dtype=np.float64)
    if b.size < 3 or b.size != t.size or np.any(t <= 0) or np.any(b < 1):
        raise ValueError(f"{gpu}/{app}: a knee fit needs >= 3 (batch >= 1, time > 0) rows, got {b.size}")

    def solve(knee: float | None) -> tuple[np.ndarray, float, np.ndarray]:
        cols = [np.ones_like(b), b] + ([np.maximum(0.0, b - knee)] if knee is not None else [])
        a = np.stack(cols, axis=1) / t[:, None]
        x0 = np.linalg.lstsq(a, np.ones_like(t), rcond=None)[0].clip(1e-9)
        res = least_squares(lambda x: a @ x - 1.0, x0, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.05)
        rel = a @ res.x - 1.0
        return res.x, float(res.cost), rel

    distinct = np.unique(b)
    x_plain, cost_plain, rel_plain = solve(None)
    best = (None, x_plain, cost_plain, rel_plain)
    for lo, hi in itertools.pairwise(distinct):
        for knee in (lo, 0.5 * (lo + hi)):
            if int(np.sum(distinct > knee)) < 1:
                continue
            x, cost, rel = solve(float(knee))
            if cost < best[2]:
                best = (float(knee), x, cost, rel)
    knee, x, cost, rel = best
    if knee is not None and cost > (2.0 / 3.0) * cost_plain:
        knee, x, rel = None, x_plain, rel_plain
    alpha, beta = float(x[0]), float(max(x[1], 1e-12))
    gamma = float(x[2]) if knee is not None else 0.0
    params = ComputeParams(
        gpu=gpu, app=app, alpha_s=alpha, beta_s=beta, exponent=1.0, host_s=0.0, k=1.0,
        max_batch=int(max_batch or b.max()), min_batch=1,
        fit_mape=float(np.mean(np.abs(rel))), knee_batch=knee, knee_beta_s=gamma,
    )  # fmt: skip
    report = {"rule": KNEE_RULE, "knee_batch": knee, "cost_plain": cost_plain, "cost": cost,
              "residual_plain": rel_plain.tolist(), "residual": rel.tolist()}  # fmt: skip
    return params, report


# --------------------------------------------------------------------------------------------
# Drift of a stored profile's step times against a refit
# --------------------------------------------------------------------------------------------


def step_time_drift(
    stored: tuple[ComputeParams, CommParams | None],
    refit: tuple[ComputeParams, CommParams | None],
    local_batches: Sequence[int],
    replicas: int,
    nodes: int = 1,
) -> dict[str, Any]:
    """How far a stored profile's step times are from a refit's (both ``(compute, comm)`` models
    of one worker type), with every one of ``replicas`` workers at each of ``local_batches``
    (:func:`step_time_s`): per batch ``drift = stored / refit - 1``; ``max_drift`` is the largest
    ``|drift|`` and ``worst_batch`` where it is."""
    if not local_batches:
        raise ValueError("step_time_drift needs at least one local batch")
    check_int("replicas", replicas, 1)
    rows = []
    for b in sorted({int(x) for x in local_batches}):
        check_int("local batch", b, 1)
        old = float(step_time_s(*stored, b, replicas, nodes))
        new = float(step_time_s(*refit, b, replicas, nodes))
        rows.append({"local_batch": b, "stored_s": old, "refit_s": new, "drift": old / new - 1.0})
    worst = max(rows, key=lambda r: abs(r["drift"]))
    return {"rows": rows, "max_drift": abs(worst["drift"]), "worst_batch": worst["local_batch"]}


def measured_drift(
    models: tuple[ComputeParams, CommParams | None],
    local_batches: Sequence[int],
    measured_s: Sequence[float],
    replicas: int,
    nodes: int = 1,
) -> dict[str, Any]:
    """How far a profile's step times (``(compute, comm)`` of one worker type, every one of
    ``replicas`` workers at each batch: :func:`step_time_s`) are from step times measured at
    ``local_batches``: per batch ``drift = model / measured - 1``; ``max_drift`` is the largest
    ``|drift|`` and ``worst_batch`` where it is."""
    if not local_batches or len(local_batches) != len(measured_s):
        raise ValueError(
            f"measured_drift needs as many measured step times as local batches (>= 1), got "
            f"{len(measured_s)} and {len(local_batches)}"
        )
    check_int("replicas", replicas, 1)
    rows = []
    for b, m in sorted(zip(local_batches, measured_s, strict=True)):
        check_int("local batch", int(b), 1)
        if not (math.isfinite(float(m)) and float(m) > 0):
            raise ValueError(f"measured step time at local batch {b} must be finite and > 0 s, got {m!r}")
        model = float(step_time_s(*models, int(b), replicas, nodes))
        rows.append(
            {"local_batch": int(b), "model_s": model, "measured_s": float(m), "drift": model / float(m) - 1.0}
        )
    worst = max(rows, key=lambda r: abs(r["drift"]))
    return {"rows": rows, "max_drift": abs(worst["drift"]), "worst_batch": worst["local_batch"]}
