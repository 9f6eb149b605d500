"""Real mode of the calibration app: native DDP ranks on this machine profiled through the real
backend (:mod:`dynamix_gym.measurement.profiling`: step-time ladder, per-interval overheads,
static-batch training curves) and fitted into a profile."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from experiments.calibration.fit import COMMAND, fit_table, holdout_summary, parse_pairs
from experiments.common import atomic_write_text, plain
from experiments.reports.markdown import overrides_text
from sim.cluster import ClusterSpec, ProfiledNodeSpec
from sim.fitting.curves import Curve, fit_convergence_curves
from sim.fitting.table import read_profile_table
from sim.hardware import ComputeParams
from sim.profile import MEASUREMENTS_FILE, write_profile
from sim.specs_io import workload_from_dict
from sim.validation import check_choice
from sim.workloads import Workload


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def real_workload(cfg: DictConfig, real: dict[str, Any], train_size: int) -> Workload:
    """The profile's workload: the real model and data set, sized from the model and the split."""
    from adapters.data import load_dataset
    from adapters.models import build_model
    from adapters.tasks import task_of
    from sim.workloads import ACCURACY

    task = task_of(real["dataset"])
    target = real.get(task.target_field)
    data = load_dataset(
        real["dataset"], val_fraction=real.get("val_fraction", 0.2), split_seed=real.get("split_seed", 0)
    )
    model = build_model(real["model"], data.input_shape, data.num_classes, norm=real.get("norm", "group"))
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    name = str(cfg.workload.name)
    overrides = {k: v for k, v in (plain(cfg.workload) or {}).items() if k != "name"}
    wl = {
        "name": name,
        "model": f"{real['model']} / {real['dataset']} ({real.get('device', 'cpu')} ranks, {real.get('dist_backend', 'gloo')})",
        "app": name,
        "convergence": name,
        "params_millions": params_m,
        "app_params_millions": params_m,
        "samples_per_epoch": int(train_size),
        "target_accuracy": float(task.default_target if target is None else target),  # the metric's units
        "num_classes": int(data.num_classes),
        # predictions per validation: a window predicts each of its bytes (sets the simulator's noise)
        "val_samples": int(data.y_val.numel()),
        "sample_bytes": float(data.x_train.element_size() * int(np.prod(data.input_shape))),
        "lr_rule": str(real.get("lr_rule", "adascale")),
        "initial_local_batch": int(real.get("initial_batch") or real.get("base_batch", 32)),
        "time_budget_s": float(real.get("time_budget_s", 600.0)),
        **({} if task.metric is ACCURACY else {"metric": asdict(task.metric)}),
        **overrides,
    }
    return workload_from_dict(wl)


def measure_real(cfg: DictConfig, real: dict[str, Any]) -> dict[str, Any]:
    """Everything real mode measures: the step-time ladder of every worker count, then on the
    configured worker count the per-interval overheads and the static-batch curves."""
    from adapters.config import RealDDPConfig
    from adapters.ddp_backend import DDPBackend
    from adapters.tasks import unreachable_target
    from dynamix_gym.measurement.profiling import profile_ladder, quiet_wait

    workers = int(real["workers"])
    counts = sorted({int(w) for w in cfg.ladder.worker_counts} | {workers})
    quiet = quiet_wait(cfg.quiet)
    load_start = loadavg()
    # Profiling never stops at the accuracy target (the env would end the overhead episode).
    base = {**real, **unreachable_target(real["dataset"]), "scenario": None, "emulate": None}
    backends = {w: DDPBackend(RealDDPConfig(**{**base, "workers": w})) for w in counts}
    notes: list[str] = []
    try:
        ladder = profile_ladder(
            backends,
            list(cfg.ladder.batches),
            iterations=int(cfg.ladder.iterations),
            repeats=int(cfg.ladder.repeats),
            warmup_iterations=int(cfg.ladder.warmup_iterations),
            budget_s=float(cfg.budget_s),
            seed=int(cfg.seed),
            progress=bool(cfg.progress),
        )
        if ladder.stopped_early:
            notes.append(ladder.message())
        main = backends[workers]
        overheads, runs = measure_on(cfg, main, workers, real, notes)
        train_size, gpu = int(main.train_size), main.spec.gpu_types[0]
    finally:
        for be in backends.values():
            be.close()
    return {"ladder": ladder, "overheads": overheads, "runs": runs, "notes": notes, "train_size": train_size,
            "gpu": gpu, "quiet": quiet, "load_start": load_start, "load_end": loadavg()}  # fmt: skip


def measure_on(
    cfg: DictConfig, main: Any, workers: int, real: dict[str, Any], notes: list[str]
) -> tuple[Any, list[Any]]:
    """The per-interval overheads and (``curves.enabled``) the static-batch curves on ``main``."""
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.measurement.profiling import measure_curves, measure_env_overheads, overhead_schedule

    env = HeteroClusterEnv(backend=main, action_mode="absolute", interval=int(cfg.interval), reward="time")
    o = cfg.overhead
    schedule = overhead_schedule([int(b) for b in o.batches], int(o.intervals), int(o.change_every), workers)
    overheads, _ = measure_env_overheads(
        env, schedule, seed=int(cfg.seed), progress=bool(cfg.progress), budget_s=float(o.budget_s)
    )
    runs: list[Any] = []
    if cfg.curves.enabled:
        runs, curve_notes = measure_curves(
            main,
            [int(b) for b in cfg.curves.local_batches],
            [int(s) for s in cfg.curves.seeds],
            iterations=int(cfg.interval),
            progress_target=float(cfg.curves.progress),
            budget_s=float(cfg.curves.budget_s),
            noise_smoothing=float(real.get("noise_smoothing", 0.2)),
            progress=bool(cfg.progress),
        )
        notes += curve_notes
    return overheads, runs


def _top(value: Any) -> int:
    """A backend batch bound: an int, or the largest of per-rank bounds."""
    return int(value) if isinstance(value, int) else max(value)


def capped_computes(computes: list[ComputeParams], cap: int, notes: list[str]) -> list[ComputeParams]:
    """Compute models whose memory cap is the real backend's ``max_batch`` (extrapolated above the
    largest batch measured, and said so in ``notes``)."""
    out = []
    for p in computes:
        if p.max_batch < cap:
            notes.append(
                f"{p.gpu}/{p.app}: measured up to local batch {p.max_batch}; the memory cap is set to the real "
                f"backend's max_batch {cap} (the compute model is extrapolated above {p.max_batch})"
            )
            p = replace(p, max_batch=cap)
        out.append(p)
    return out


def fit_curves(
    cfg: DictConfig, runs: list[Any], workload: Workload, real: dict[str, Any], notes: list[str]
) -> tuple[Workload, list[Any], dict[str, Any] | None]:
    """The workload's convergence model fitted to the measured static-batch curves (with fewer
    than two batches: the shipped cifar10 model borrowed, and a note)."""
    mode = str(cfg.curves.get("grad_stats", "raw"))
    check_choice("curves.grad_stats", mode, GRAD_STATS)
    smoothing = float(real.get("noise_smoothing", 0.2))
    curves = [_fill_grad(_curve(r, mode, smoothing)) for r in runs if len(r.rows) >= 2]
    if mode == "raw" and any("grad_sqr_raw" not in r.rows[0] for r in runs if r.rows):
        notes.append(
            "curves.grad_stats=raw: the curves record only the estimator's moving average, so each "
            f"interval's own two-batch estimates were recovered from it (smoothing {smoothing:g})"
        )
    if len({c.global_batch for c in curves}) < 2:
        notes.append(
            "no training curves at two or more batches (curves.enabled=false or out of time): the workload "
            "borrows the shipped cifar10 convergence model, so simulated accuracy is not this workload's"
        )
        return replace(workload, convergence="cifar10"), [], None
    cf = fit_convergence_curves(
        curves,
        name=workload.convergence,
        base_batch=int(real.get("base_batch", 32)),
        acc_chance=workload.chance_quality,
        memory_fraction=float(cfg.curves.memory_fraction),
        bins=int(cfg.curves.bins),
        targets=[workload.target_quality],
        refit_targets=refit_targets(cfg, workload.target_quality),
    )
    report = {
        "grad_stats": mode,
        "rmse_binned": cf.rmse_binned,
        "rmse_raw": cf.rmse_raw,
        "rmse_by_global_batch": cf.rmse_by_batch,
        "steps_to_target": cf.steps_to_target,
        "grad_rmse_log_noise": cf.grad_rmse_log_noise,
        "notes": cf.notes,
    }
    return workload, [cf.params], report


#: ``curves.grad_stats``: which gradient statistics the convergence model's are fitted to.
#: ``raw``: each interval's own two-batch estimates, which is what the simulator's statistics stand
#: for (an env smooths a simulated report with the same moving average as a real one, so a model
#: fitted to the average is smoothed twice and lags: on the LM, the average of a first interval at
#: |G|^2 = 8 decays over 15 intervals while the estimates fall to 0.1-0.3 at the second);
#: ``ema``: the real estimator's moving average (the fit before 2026-12-07).
GRAD_STATS = ("raw", "ema")


def unsmooth(ema: np.ndarray, smoothing: float) -> np.ndarray:
    """The series an exponential moving average (weight ``smoothing``, started at its first value, as
    :class:`dynamix_gym.stats.NoiseScaleEstimator`) averaged: x_t = e_(t-1) + (e_t - e_(t-1)) / a.
    Entries before the first finite value stay NaN."""
    ema = np.asarray(ema, dtype=np.float64)
    out = ema.copy()
    finite = np.flatnonzero(np.isfinite(ema))
    if finite.size:
        i0 = finite[0]
        out[i0 + 1 :] = ema[i0:-1] + (ema[i0 + 1 :] - ema[i0:-1]) / smoothing
    return out


def _curve(r: Any, grad_stats: str = "ema", smoothing: float = 0.2) -> Curve:
    """A measured run's :class:`Curve`, its gradient statistics per ``grad_stats`` (:data:`GRAD_STATS`)."""
    rows = r.rows
    g2 = np.array([x["grad_sqr"] for x in rows], dtype=np.float64)
    gv = np.array([x["grad_var"] for x in rows], dtype=np.float64)
    if grad_stats == "raw":
        if all("grad_sqr_raw" in x for x in rows):
            g2 = np.array([x["grad_sqr_raw"] for x in rows], dtype=np.float64)
            gv = np.array([x["grad_var_raw"] for x in rows], dtype=np.float64)
        else:
            g2, gv = unsmooth(g2, smoothing), unsmooth(gv, smoothing)
    return Curve(
        global_batch=r.global_batch,
        steps=np.array([x["steps"] for x in rows], dtype=np.float64),
        progress=np.array([x["progress"] for x in rows]),
        val_accuracy=np.array([x["val_accuracy"] for x in rows]),
        grad_sqr=g2,
        grad_var=gv,
        train_accuracy=np.array([x["train_accuracy"] for x in rows]),
        seed=r.seed,
    )


def real_cluster(name: str, gpu: str, workers: int) -> ClusterSpec:
    """One node of ``workers`` ranks on this machine's cores, its memory shared among them."""
    import psutil

    mem_total = psutil.virtual_memory().total / 2**30
    node = ProfiledNodeSpec(
        gpu=gpu,
        gpus=workers,
        cpu_cores=os.cpu_count() or 1,
        host_mem_gib=mem_total,
        mem_gib=mem_total / workers,
    )
    return ClusterSpec(name=name, nodes=(node,))


def real_meta(
    cfg: DictConfig, real: dict[str, Any], m: dict[str, Any], fit: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    """The profile's provenance, measured spread and calibration record (``extra``: additive
    types, convergence report, notes)."""
    ladder, overheads, workers = m["ladder"], m["overheads"], int(real["workers"])
    cvs = [p["step_cv"] for p in ladder.points if p["workers"] == workers and math.isfinite(p["step_cv"])]
    return {
        "provenance": {
            "command": COMMAND + overrides_text(),
            "mode": "real",
            "real_config": real,
            "interval": int(cfg.interval),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_start": m["load_start"],
            "loadavg_end": m["load_end"],
            "quiet_wait": m["quiet"],
            "cpu_count": os.cpu_count(),
        },
        "measured": {"compute_noise_cv": float(np.median(cvs)) if cvs else None},
        "calibration": {
            "ladder": {"message": ladder.message(), "stopped_early": ladder.stopped_early, "skipped": ladder.skipped,
                       "elapsed_s": ladder.elapsed_s, "budget_s": ladder.budget_s},
            "holdout": holdout_summary(fit["holdout"]),
            "additive_types": extra["additive"],
            "overheads": {"interval_overhead_s": overheads.interval_overhead_s,
                          "reconfig_delay_s": overheads.reconfig_delay_s, "samples": overheads.samples},
            "convergence": extra["convergence"],
            "notes": extra["notes"],
        },
    }  # fmt: skip


def calibrate_real(cfg: DictConfig, out: Path) -> dict[str, Any]:
    from dynamix_gym.measurement.profiling import reference_rows

    real = plain(cfg.real)
    workers = int(real["workers"])
    m = measure_real(cfg, real)
    ladder, overheads, runs, notes, gpu = m["ladder"], m["overheads"], m["runs"], m["notes"], m["gpu"]
    workload = real_workload(cfg, real, m["train_size"])
    model = f"{real['model']}/{real['dataset']} on {gpu} ranks ({real.get('dist_backend', 'gloo')})"
    table = read_profile_table(pd.DataFrame(reference_rows(ladder, workload.app, model)))
    # A CPU rank has no host pipeline beside its device: its whole fixed cost is compute.
    if cfg.additive_types is not None:
        additive = [str(g) for g in cfg.additive_types]
    else:
        additive = [gpu] if real.get("device", "cpu") == "cpu" else []
    fit = fit_table(table, parse_pairs(cfg.host_floor_pairs), int(cfg.holdout_every), additive)
    computes = capped_computes(fit["computes"], _top(real.get("max_batch", 512)), notes)
    workload, conv_params, conv_report = fit_curves(cfg, runs, workload, real, notes)
    simulator = {
        "reconfig_delay_s": overheads.reconfig_delay_s,
        "interval_overhead_s": overheads.interval_overhead_s,
        "min_batch": _top(real.get("min_batch", 8)),
    }
    extra = {"additive": additive, "convergence": conv_report, "notes": notes}
    profile = write_profile(
        out,
        name=str(cfg.name),
        cluster=real_cluster(str(cfg.name), gpu, workers),
        workload=workload,
        computes=computes,
        comms=fit["comms"],
        convergences=conv_params,
        simulator=simulator,
        meta=real_meta(cfg, real, m, fit, extra),
        model_extras=fit["extras"],
    )
    write_measurements(out, table, ladder, runs)
    return {"profile": profile, "fit": fit, "notes": notes, "ladder": ladder, "overheads": overheads}


def write_measurements(out: Path, table: pd.DataFrame, ladder: Any, runs: list[Any]) -> None:
    """The measured ladder table, its intervals and (when measured) the curves beside the profile."""
    atomic_write_text(out / MEASUREMENTS_FILE, table.to_csv(index=False))
    atomic_write_text(out / "ladder_intervals.csv", pd.DataFrame(ladder.intervals).to_csv(index=False))
    if runs:
        curve_rows = [
            {"local_batch": r.local_batch, "global_batch": r.global_batch, "seed": r.seed, **x}
            for r in runs
            for x in r.rows
        ]
        atomic_write_text(out / "curves.csv", pd.DataFrame(curve_rows).to_csv(index=False))


def refit_targets(cfg: DictConfig, target: float) -> list[float]:
    if cfg.curves.get("refit_targets") is not None:
        return [float(a) for a in cfg.curves.refit_targets]
    return [round(target - 0.03, 4), round(target - 0.015, 4), float(target)]


def _fill_grad(c: Curve) -> Curve:
    """Gradient statistics are unknown before the first two-batch estimate: back-fill them."""
    g2, gv = c.grad_sqr.copy(), c.grad_var.copy()
    ok = np.isfinite(g2) & np.isfinite(gv) & (g2 > 0) & (gv > 0)
    if not ok.any():
        raise ValueError(f"the curve at global batch {c.global_batch} has no usable gradient-noise estimate")
    idx = np.flatnonzero(ok)
    for arr in (g2, gv):
        arr[~ok] = np.interp(np.flatnonzero(~ok), idx, arr[idx])
    return replace(c, grad_sqr=g2, grad_var=gv)


def refit_convergence_dir(cfg: DictConfig, out: Path) -> dict[str, Any]:
    """``refit_convergence=true``: refit the convergence model of the real profile in ``out`` from
    the static-batch curves it measured (``curves.csv``), after a change of the model or its fit,
    measuring nothing. Rewrites ``convergence_models.json`` and the convergence section of
    ``profile.json`` (the provenance records the refit); the rest of the profile stays as measured.
    Returns the convergence report."""
    import json
    from types import SimpleNamespace

    from sim.convergence import GRAD_SPREAD_FIELDS
    from sim.datafiles import dump_json
    from sim.profile import CONVERGENCE_FILE, PROFILE_FILE, load_profile

    profile = load_profile(out)
    curves_csv = out / "curves.csv"
    if not curves_csv.is_file():
        raise FileNotFoundError(
            f"refit_convergence=true needs the measured curves {curves_csv} (a real-mode profile)"
        )
    doc = json.loads((out / PROFILE_FILE).read_text())
    real = dict((doc.get("provenance") or {}).get("real_config") or {})
    table = pd.read_csv(curves_csv)
    runs = [
        SimpleNamespace(global_batch=int(gb), seed=int(seed), rows=g.sort_values("steps").to_dict("records"))
        for (gb, seed), g in table.groupby(["global_batch", "seed"])
    ]
    notes: list[str] = []
    _, params, report = fit_curves(cfg, runs, profile.workload, real, notes)
    if report is None:
        raise ValueError(f"{curves_csv}: {notes[-1]}")
    # a gradient spread fitted to real ranks (experiments.fit_grad_spread) is not the curves' to refit
    kept = {r["name"]: r for r in json.loads((out / CONVERGENCE_FILE).read_text())["models"]}
    params = [
        replace(p, **{f: kept[p.name][f] for f in GRAD_SPREAD_FIELDS if f in kept.get(p.name, {})})
        for p in params
    ]
    atomic_write_text(
        out / CONVERGENCE_FILE,
        dump_json({"generated_by": "python -m experiments.calibrate refit_convergence=true",
                   "models": [asdict(p) for p in params]}),
    )  # fmt: skip
    doc["calibration"]["convergence"] = report
    doc["provenance"].setdefault("refits", []).append({
        "command": COMMAND + overrides_text(),
        "what": "convergence model refitted from curves.csv",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip
    atomic_write_text(out / PROFILE_FILE, dump_json(doc))
    load_profile(out)  # the rewritten profile loads (checked)
    return report
