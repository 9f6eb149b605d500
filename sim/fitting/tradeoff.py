"""The ResNet-34 / CIFAR-100 accuracy trade-off (DYNAMIX's table): static-batch peaks and times,
the no-scaling regime's fit and the schedule checks built on it."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sim.cluster import ClusterSpec
from sim.convergence import ConvergenceModel, ConvergenceParams
from sim.datafiles import data_path
from sim.fitting.convergence import MAX_NONE_EXPONENT
from sim.fitting.lsq import multi_start_lsq
from sim.hardware import ComputeModel, compute_params
from sim.network import CommModel, comm_params
from sim.workloads import Workload

TRADEOFF_FILE = "reference/tradeoff_resnet34_cifar100.csv"


# --- ResNet-34 / CIFAR-100 trade-off (DYNAMIX) --------------------------------------------------
@dataclass(frozen=True)
class TradeoffPoint:
    local_batch: int
    peak_accuracy: float  # fraction
    minutes_to_peak: float
    source: str


def load_tradeoff(path: str | Path | None = None) -> list[TradeoffPoint]:
    with open(path or data_path(TRADEOFF_FILE), newline="") as fh:
        rows = [
            TradeoffPoint(int(r["local_batch"]), float(r["peak_accuracy"]),
                          float(r["minutes_to_peak"]), r["source"])
            for r in csv.DictReader(fh)
        ]  # fmt: skip
    return sorted(rows, key=lambda r: r.local_batch)


def static_iteration_time_s(workload: Workload, cluster: ClusterSpec, local_batch: int) -> float:
    """Noise-free BSP iteration time with every worker of ``cluster`` at ``local_batch``.

    T_iter = smooth_max_gamma(max over workers of T_compute(b), T_sync(R, nodes)), the fitted
    compute and communication models of ``workload.app`` scaled to the workload's FLOPs and bytes.
    """
    gpus = cluster.gpu_types
    compute = max(
        float(ComputeModel(compute_params(g, workload.app), workload.flops_scale).compute_time_s(local_batch))
        for g in set(gpus)
    )
    comm = CommModel(
        [comm_params(g, workload.app) for g in sorted(set(gpus))],
        replicas=cluster.num_workers,
        nodes=cluster.num_nodes,
        model_bytes=workload.model_bytes,
        size_scale=workload.comm_scale,
    )
    return float(comm.iteration_time_s(compute, comm.sync_time_s()))


#: Widenings of the noise counter's grid in :func:`steps_to_progress` before a progress counts as
#: out of reach (each one scales the grid by the shortfall; one or two suffice in practice).
_MAX_WIDENINGS = 8


def steps_to_progress(model: ConvergenceModel, global_batch: float, progress: float) -> float:
    """Optimiser steps a static run at ``global_batch`` needs to reach ``progress``.

    With a split noise (:attr:`ConvergenceModel.split_noise`) the run's two counters are integrated
    over the statistics' counter q: steps n(q) = int dq / r_q and progress p(q) = int r_p / r_q dq,
    read where p(q) reaches ``progress``. Above the base batch the larger progress noise raises the
    gain (p >= q); below it, it lowers it (p < q: the counter runs ahead of the progress), so the
    grid over q is widened until p(q) reaches ``progress``."""
    if model.split_noise:
        if progress <= 0.0:
            return 0.0
        q_end = progress
        for _ in range(_MAX_WIDENINGS):
            q = np.linspace(0.0, q_end, 4001)
            inv_q = 1.0 / model.progress_per_step_many(global_batch, q, reported=True)
            ratio = model.progress_per_step_many(global_batch, q) * inv_q
            dq = np.diff(q)
            p = np.concatenate([[0.0], np.cumsum(dq * 0.5 * (ratio[1:] + ratio[:-1]))])
            if p[-1] >= progress:
                n = np.concatenate([[0.0], np.cumsum(dq * 0.5 * (inv_q[1:] + inv_q[:-1]))])
                return float(np.interp(progress, p, n))
            q_end *= 1.05 * progress / max(p[-1], 1e-12 * progress)
        return math.inf
    grid = np.linspace(0.0, progress, 4001)
    inv = 1.0 / model.progress_per_step_many(global_batch, grid)
    return float(np.sum(np.diff(grid) * 0.5 * (inv[1:] + inv[:-1])))


def progress_to_accuracy(model: ConvergenceModel, global_batch: float, target: float) -> float:
    """Progress at which a static run at ``global_batch`` first reaches ``target`` (inf if never)."""
    mem = math.log2(global_batch)
    x_end = model.params.shape_x[-1] * model.stretch(mem)
    grid = np.linspace(0.0, x_end, 40001)
    hit = np.nonzero(model.accuracy_many(grid, mem) >= target)[0]
    return float(grid[hit[0]]) if len(hit) else math.inf


def static_time_to_accuracy_min(
    model: ConvergenceModel, global_batch: float, iteration_time_s: float, target: float
) -> float:
    p = progress_to_accuracy(model, global_batch, target)
    if math.isinf(p):
        return math.inf
    return steps_to_progress(model, global_batch, p) * iteration_time_s / 60.0


def static_peak(
    model: ConvergenceModel, global_batch: float, iteration_time_s: float, peak_tol: float
) -> tuple[float, float]:
    """(peak accuracy, minutes to reach it) of a static run.

    The peak is the run's plateau, ceiling(log2 M); it counts as reached at the first step whose
    accuracy is within ``peak_tol`` (a fraction, e.g. 0.005 = half a point) of the plateau.
    """
    peak = model.ceiling(math.log2(global_batch))
    return peak, static_time_to_accuracy_min(model, global_batch, iteration_time_s, peak - peak_tol)


def borrowed_params(
    base: ConvergenceParams, name: str, *, progress_scale: float, acc_chance: float,
    acc_ceiling: float, ref_batch: float, gap_per_doubling: float, stretch_exponent: float,
    none_exponent: float, memory_fraction: float,
) -> ConvergenceParams:  # fmt: skip
    """``base``'s shape and gradient statistics stretched by ``progress_scale`` in progress."""
    total = base.total_progress * progress_scale
    return replace(
        base,
        name=name,
        total_progress=total,
        progress_knots=tuple(progress_scale * k for k in base.progress_knots),
        shape_x=tuple(progress_scale * x for x in base.shape_x),
        acc_chance=acc_chance,
        acc_ceiling=acc_ceiling,
        ref_batch=ref_batch,
        gap_per_doubling=gap_per_doubling,
        stretch_exponent=stretch_exponent,
        none_exponent=none_exponent,
        batch_memory_progress=memory_fraction * total,
        train_gap=1.0 - acc_ceiling,
        fit_rmse=float("nan"),
    )


@dataclass
class TradeoffFit:
    params: ConvergenceParams
    rows: list[dict]  # per local batch: reported vs reproduced
    best_static: dict[str, dict]  # target -> {local_batch, minutes}
    dynamic: dict


def fit_tradeoff(
    base: ConvergenceParams,
    points: Sequence[TradeoffPoint],
    iteration_time_s: dict[int, float],
    workers: int,
    num_classes: int,
    lr_rule: str,
    memory_fraction: float,
    peak_tol: float,
    name: str = "cifar100_resnet34",
) -> TradeoffFit:
    """Fit a borrowed-shape model to reported (local batch, peak accuracy, minutes to peak).

    Peak accuracy is linear in log2(global batch): acc_ceiling and gap_per_doubling come from a
    straight-line fit, ref_batch is the smallest reported global batch. For static runs the stretch
    exponent and the no-scaling exponent are degenerate (steps to peak ~ M^stretch / M^none), so
    the stretch exponent is borrowed from ``base`` (measured there) and the progress scale of the
    borrowed shape and ``none_exponent`` (bounded to [0, 0.5], see :class:`ConvergenceParams`) are
    fitted to log(minutes to peak) by least squares.
    """
    batches = np.array([p.local_batch * workers for p in points], dtype=np.float64)
    peaks = np.array([p.peak_accuracy for p in points])
    doublings = np.log2(batches / batches.min())
    slope, intercept = np.polyfit(doublings, peaks, 1)
    acc_ceiling, gap = float(intercept), float(max(0.0, -slope))
    minutes = np.array([p.minutes_to_peak for p in points])
    t_iter = np.array([iteration_time_s[p.local_batch] for p in points])

    def make(z: np.ndarray) -> ConvergenceParams:
        return borrowed_params(
            base, name, progress_scale=float(np.exp(z[0])), acc_chance=1.0 / num_classes,
            acc_ceiling=acc_ceiling, ref_batch=float(batches.min()), gap_per_doubling=gap,
            stretch_exponent=base.stretch_exponent, none_exponent=float(z[1]),
            memory_fraction=memory_fraction,
        )  # fmt: skip

    def residuals(z: np.ndarray) -> np.ndarray:
        model = ConvergenceModel(make(z), lr_rule)
        sim = [static_peak(model, m, t, peak_tol)[1] for m, t in zip(batches, t_iter, strict=True)]
        return np.log(np.array(sim)) - np.log(minutes)

    best = multi_start_lsq(
        residuals,
        ([math.log(s0), ne0] for s0 in (0.5, 2.0, 8.0) for ne0 in (0.1, 0.4)),
        bounds=([math.log(0.01), 0.0], [math.log(100.0), MAX_NONE_EXPONENT]),
    )
    params = make(best.x)
    model = ConvergenceModel(params, lr_rule)
    rows = []
    for p, m, t in zip(points, batches, t_iter, strict=True):
        acc, mins = static_peak(model, m, t, peak_tol)
        rows.append({
            "local_batch": p.local_batch, "global_batch": int(m), "iteration_time_s": float(t),
            "reported_accuracy": p.peak_accuracy, "sim_accuracy": acc,
            "accuracy_error_points": 100 * (acc - p.peak_accuracy),
            "reported_minutes": p.minutes_to_peak, "sim_minutes": mins,
            "minutes_rel_error": mins / p.minutes_to_peak - 1.0,
        })  # fmt: skip
    best_static = {}
    for target in sorted({float(v) for v in peaks}):
        times = {
            p.local_batch: static_time_to_accuracy_min(model, m, t, target - peak_tol)
            for p, m, t in zip(points, batches, t_iter, strict=True)
        }
        b = min(times, key=times.get)
        best_static[f"{target:.2f}"] = {"local_batch": b, "minutes": times[b],
                                        "minutes_by_local_batch": times}  # fmt: skip
    dyn = dynamic_check(model, points, batches, t_iter, peak_tol)
    return TradeoffFit(params, rows, best_static, dyn)


def simulate_schedule(
    model: ConvergenceModel,
    phases: Sequence[tuple[float, float, float]],
    target: float,
    max_minutes: float,
    dt_steps: int = 20,
    trajectory: list[tuple[float, float]] | None = None,
) -> float:
    """Minutes until ``target`` under a batch schedule, stepping the model's scalar API.

    ``phases``: (global batch, iteration time s, progress at which the phase ends; inf = last),
    advanced ``dt_steps`` steps at a time (midpoint rule, as the engine does). If ``trajectory`` is
    given, (minutes, accuracy) pairs are appended to it.
    """
    progress, noise_progress, minutes = 0.0, 0.0, 0.0
    mem = model.initial_batch_memory(phases[0][0])
    for m, t_iter, p_end in phases:
        while progress < p_end and minutes < max_minutes:
            dp, dq = model.advance(m, progress, noise_progress, dt_steps)
            progress += dp
            noise_progress += dq
            mem = model.update_batch_memory(mem, m, dp)
            minutes += dt_steps * t_iter / 60.0
            acc = model.accuracy(progress, mem)
            if trajectory is not None:
                trajectory.append((minutes, acc))
            if acc >= target:
                return minutes
    return math.inf


def dynamic_check(
    model: ConvergenceModel,
    points: Sequence[TradeoffPoint],
    batches: np.ndarray,
    t_iter: np.ndarray,
    peak_tol: float,
) -> dict:
    """A larger batch first, then the smallest: does some switch point beat every static batch?

    The target is the best static peak (within ``peak_tol``); only the smallest batch reaches it
    statically. Every larger batch is tried as the first phase, switching after a fraction f (on a
    grid) of the progress the static smallest-batch run needs.
    """
    target = model.ceiling(math.log2(batches.min())) - peak_tol
    static = [static_time_to_accuracy_min(model, m, t, target) for m, t in zip(batches, t_iter, strict=True)]
    p_need = progress_to_accuracy(model, batches.min(), target)
    lo_m, lo_t = batches[0], t_iter[0]
    best = (math.inf, None, None)
    for i in range(1, len(points)):
        for frac in np.linspace(0.05, 0.95, 19):
            phases = [(batches[i], t_iter[i], frac * p_need), (lo_m, lo_t, math.inf)]
            mins = simulate_schedule(model, phases, target, 1.5 * min(static))
            if mins < best[0]:
                best = (mins, float(frac), points[i].local_batch)
    return {
        "target_accuracy": target,
        "static_minutes": {str(p.local_batch): v for p, v in zip(points, static, strict=True)},
        "schedule": f"local batch B1 until a fraction f of the progress the static "
        f"local-{points[0].local_batch} run needs to reach the target, then local batch "
        f"{points[0].local_batch}",
        "switch_reference_progress": p_need,
        "best_first_local_batch": best[2],
        "best_switch_fraction": best[1],
        "dynamic_minutes": best[0],
        "beats_every_static": bool(best[0] < min(static)),
    }
