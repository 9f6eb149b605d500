"""Calibrate the simulator to a real setup and write a cluster profile.

    python -m experiments.calibrate [name=cpu2] [out_dir=DIR] [budget_s=300] [curves.enabled=false]
    python -m experiments.calibrate table=TABLE.csv [traces=TRACES.csv] [workload=WORKLOAD.yaml] [out_dir=DIR] [app=cifar10]

Real mode (default) profiles native DDP ranks on this machine through the real backend
(:mod:`dynamix_gym.measurement.profiling`): each worker count's step time over a ladder of local batches
(the one-worker rows give the compute model, the others the all-reduce model), the wall time an
episode pays per decision interval beyond its iterations, and static-batch training curves for the
convergence model. Table mode fits a measured table in the reference format instead
(``sim/data/reference/README.md``; :func:`sim.fitting.table.read_profile_table` rejects ill-formed ones).
With ``traces=`` (convergence traces in the reference format, the metric in the workload's own
units) and ``workload=`` (a YAML file of :class:`sim.workloads.Workload` fields, or a preset name),
table mode also fits the workload's convergence model (:mod:`sim.traces_table`,
:func:`sim.fitting.convergence.fit_app`): an application the project has never seen, with a rising
or falling metric, needs no code edit. Both modes fit with :func:`sim.fitting.hardware.fit_all`, the fit
behind the shipped models, and write a profile directory (:mod:`sim.profile`) with
``calibration.md`` / ``calibration.json`` next to it (the figures of every fit report: step-time
leave-one-batch-out MdAPE per worker type, and with traces accuracy RMSE and epochs-to-target
Kendall tau). The directory appears whole or not at all.

Returns the held-out step-time MdAPE (pooled over worker types).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from experiments.common import atomic_write_text, describe_file, plain, shown
from sim.cluster import ClusterSpec, NodeSpec
from sim.convergence import ConvergenceParams, convergence_table
from sim.datafiles import data_path
from sim.fitting.convergence import fit_app
from sim.fitting.curves import Curve, fit_convergence_curves
from sim.fitting.step_time import ADDITIVE_RULE, fit_models, holdout_errors
from sim.fitting.table import read_profile_table
from sim.hardware import GPU_MEMORY_GIB, ComputeParams
from sim.profile import (
    MEASUREMENTS_FILE,
    PROFILES_DIR,
    ClusterProfile,
    ProfiledNodeSpec,
    dump_json,
    write_profile,
)
from sim.specs_io import spec_from_dict, workload_from_dict, workload_to_dict
from sim.traces_table import app_spec, read_traces
from sim.workloads import WORKLOADS, Workload

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.calibrate"


def out_dir_of(cfg: DictConfig) -> Path:
    if cfg.get("out_dir"):
        return Path(to_absolute_path(str(cfg.out_dir)))
    return data_path(PROFILES_DIR) / str(cfg.name)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------------------------
# Fitting (both modes)
# --------------------------------------------------------------------------------------------


def fit_table(
    table: pd.DataFrame,
    host_floor_pairs: list[tuple[str, str]],
    holdout_every: int,
    additive_types: list[str],
) -> dict[str, Any]:
    """Compute and communication fits of every (worker type, app) of a validated table, and the
    held-out step-time check (``additive_types``: see :data:`sim.fitting.step_time.ADDITIVE_RULE`)."""
    computes, comms, diags = fit_models(table, additive_types, host_floor_pairs)
    try:
        holdout = holdout_errors(table, holdout_every, host_floor_pairs, additive_types)
    except ValueError as err:  # a ladder too short to hold batches out
        holdout = {"rows": [], "mdape": {}, "mdape_all": math.nan, "error": str(err)}
    extras = {
        key: {
            "exponent_mode": d["exponent_mode"],
            "compute_source": d["compute_source"],
            "loo_per_batch": [[int(b), float(e)] for b, e in sorted(d["loo_per_batch"].items())],
            "comm_fit": d["comm"],
        }
        for key, d in diags.items()
    }
    return {"computes": computes, "comms": comms, "diagnostics": diags, "holdout": holdout, "extras": extras}


def parse_pairs(items: Any) -> list[tuple[str, str]]:
    out = []
    for s in items or []:
        gpu, sep, app = str(s).partition("/")
        if not sep or not gpu or not app:
            raise ValueError(f"host_floor_pairs entries must be 'gpu/app', got {s!r}")
        out.append((gpu, app))
    return out


# --------------------------------------------------------------------------------------------
# Table mode
# --------------------------------------------------------------------------------------------


def table_cluster(cfg: DictConfig, table: pd.DataFrame, app: str, memory: dict[str, float]) -> ClusterSpec:
    spec = plain(cfg.get("cluster"))
    nodes = []
    if spec:
        for i, n in enumerate(spec.get("nodes") or []):
            gpu = str(n["gpu"])
            if gpu not in set(table["gpu"]):
                raise ValueError(
                    f"cluster.nodes[{i}].gpu {gpu!r} has no rows in the table ({sorted(set(table['gpu']))})"
                )
            nodes.append(_node(gpu, int(n.get("gpus", 1)), memory))
        if not nodes:
            raise ValueError("cluster needs a non-empty `nodes` list of {gpu, gpus}")
        return ClusterSpec(name=str(spec.get("name", cfg.name)), nodes=tuple(nodes))
    for gpu in sorted(set(table.loc[table["app"] == app, "gpu"])):
        rows = table[(table["gpu"] == gpu) & (table["app"] == app)]
        per_node = rows["num_gpus"] // rows["num_nodes"]
        nodes.append(_node(gpu, int(per_node.max()), memory))
    return ClusterSpec(name=str(cfg.name), nodes=tuple(nodes))


def _node(gpu: str, gpus: int, memory: dict[str, float]) -> NodeSpec:
    if gpu in GPU_MEMORY_GIB and gpu not in memory:
        return NodeSpec(gpu=gpu, gpus=gpus)
    if gpu not in memory:
        memory[gpu] = 16.0
        log.warning(
            "no device memory given for worker type %s: 16 GiB assumed (gpu_memory_gib.%s=...)", gpu, gpu
        )
    return ProfiledNodeSpec(gpu=gpu, gpus=gpus, mem_gib=memory[gpu])


#: Workload fields a workload file may leave out, and what they become (see :func:`table_workload`).
WORKLOAD_FILE_DEFAULTS = (
    "model: the name; app: the table's application (app= or the table's only one, else the name); "
    "convergence: the name; app_params_millions: params_millions; num_classes: 2 (the loss proxy "
    "only); val_samples: 10000 (the noise of measured validation quality)"
)


def workload_file_dict(ref: str) -> tuple[dict[str, Any], str]:
    """The fields of ``workload=<ref>``: a YAML file of :class:`Workload` fields, or a preset name."""
    if ref in WORKLOADS and not Path(ref).suffix:
        return workload_to_dict(WORKLOADS[ref]), f"preset {ref}"
    path = Path(to_absolute_path(ref))
    if not path.is_file():
        raise FileNotFoundError(
            f"workload={ref}: no such file, nor a preset ({sorted(WORKLOADS)}); give a YAML file of "
            "sim.workloads.Workload fields (see conf/workload/*.yaml)"
        )
    doc = plain(OmegaConf.load(path))
    if not isinstance(doc, dict):
        raise ValueError(
            f"workload file {path.name} must hold a mapping of Workload fields, got {type(doc).__name__}"
        )
    return doc, str(path)


def table_workload(cfg: DictConfig, apps: list[str], src: Path) -> tuple[Workload, list[str]]:
    """The profile's workload in table mode, and notes on where it came from.

    ``workload=<file or preset>``: that spec, the fields of :data:`WORKLOAD_FILE_DEFAULTS` filled
    in. Otherwise the shipped preset of the table's application, or (a new application without a
    spec) CIFAR-10's figures with its convergence model borrowed, as before.
    """
    notes: list[str] = []
    ref = cfg.get("workload_file")
    if ref:
        doc, where = workload_file_dict(str(ref))
        if "name" not in doc:
            raise ValueError(f"workload file {where} lacks the required key 'name'")
        name = str(doc["name"])
        default_app = str(cfg.app) if cfg.get("app") else (apps[0] if len(apps) == 1 else name)
        filled = {"model": name, "app": default_app, "convergence": name,
                  "app_params_millions": doc.get("params_millions"), "num_classes": 2, "val_samples": 10_000}  # fmt: skip
        given = {k: v for k, v in filled.items() if k not in doc}
        try:
            workload = spec_from_dict(Workload, {**given, **doc}, f"workload ({where})")
        except (TypeError, ValueError) as err:
            raise ValueError(str(err)) from None
        if given:
            notes.append(f"workload {name} from {where}; not given there, so set: {given}")
        return workload, notes
    app = str(cfg.app) if cfg.get("app") else ("cifar10" if "cifar10" in apps else apps[0])
    if app not in apps:
        raise ValueError(f"app {app!r} has no rows in {src.name} (apps: {apps})")
    shipped = [w for w in WORKLOADS.values() if w.app == app and w.name == app]
    if shipped:
        return shipped[0], notes
    wl = {"name": app, "model": app, "app": app, "convergence": "cifar10", "params_millions": 11.17,
          "app_params_millions": 11.17, "samples_per_epoch": 50_000, "target_accuracy": 0.93,
          "num_classes": 10, "val_samples": 10_000}  # fmt: skip
    wl.update(plain(cfg.get("workload")) or {})
    workload = workload_from_dict(wl)
    if not cfg.get("traces"):
        notes.append(
            f"application {app!r} is not a shipped workload: its workload spec is {wl} and it borrows "
            f"the convergence model {workload.convergence!r} (give workload=<yaml> and traces=<csv>)"
        )
    return workload, notes


def fit_traces(cfg: DictConfig, workload: Workload) -> tuple[Workload, ConvergenceParams, dict[str, Any]]:
    """The workload's convergence model fitted to ``traces=<csv>`` (:func:`sim.fitting.convergence.fit_app`)
    and its report: accuracy RMSE (quality and metric units) and epochs-to-target Kendall tau."""
    path = Path(to_absolute_path(str(cfg.traces)))
    if workload.convergence == "cifar10" and workload.name != "cifar10":
        workload = replace(workload, convergence=workload.name)  # its own model, not the borrowed one
    traces = read_traces(path, workload)
    spec = app_spec(workload, traces)
    fit = fit_app(workload.convergence, traces, float(cfg.memory_fraction), spec)
    m = workload.metric
    ordering = [{**o, "target_metric": float(m.from_quality(o["target"]))} for o in fit.ordering]
    report = {
        "source": describe_file(path),
        "metric": {"name": m.name, "higher_is_better": m.higher_is_better, "scale": m.scale, "untrained": m.untrained},
        "batches": [t.global_batch for t in traces],
        "accuracy_rmse": fit.rmse["all"],  # quality fraction
        "accuracy_rmse_metric": fit.rmse["all"] / m.scale,  # metric units
        "accuracy_rmse_by_batch": {b: v for b, v in fit.rmse.items() if b != "all"},
        "ordering": ordering,
        "kendall_tau": {f"{o['target_metric']:.6g}": o["kendall_tau"] for o in ordering},
        "adascale_steps_rel_error": fit.iteration_rel_error,
        "noise_scale_at_epochs": fit.grad.noise_scale_at_epochs,
        "notes": fit.notes,
    }  # fmt: skip
    return workload, fit.params, report


def fit_figures(profile: ClusterProfile, convergence: dict[str, Any] | None) -> dict[str, Any]:
    """The figures every fit report gives: step-time leave-one-batch-out MdAPE per worker type
    (the workload's application), accuracy RMSE and epochs-to-target Kendall tau (with traces)."""
    app = profile.workload.app
    out: dict[str, Any] = {
        "step_time_loo_mdape": {g: p.loo_mdape for (g, a), p in sorted(profile.compute.items()) if a == app},
    }
    if convergence:
        out |= {
            "metric": convergence["metric"]["name"],
            "accuracy_rmse": convergence["accuracy_rmse"],
            "accuracy_rmse_metric": convergence["accuracy_rmse_metric"],
            "epochs_to_target_kendall_tau": convergence["kendall_tau"],
        }
    return out


def calibrate_from_table(cfg: DictConfig, out: Path) -> dict[str, Any]:
    src = Path(to_absolute_path(str(cfg.table)))
    table = read_profile_table(src)
    apps = sorted(set(table["app"]))
    workload, notes = table_workload(cfg, apps, src)
    if workload.app not in apps:
        raise ValueError(
            f"workload {workload.name}: app {workload.app!r} has no rows in {src.name} (column app holds {apps})"
        )
    convergences, conv_report = [], None
    if cfg.get("traces"):
        workload, params, conv_report = fit_traces(cfg, workload)
        convergences = [params]
    elif (workload.convergence,) not in convergence_table():
        raise ValueError(
            f"workload {workload.name}: convergence model {workload.convergence!r} is not shipped "
            f"({sorted(k for (k,) in convergence_table())}); give traces=<csv> to fit it, or name a shipped one"
        )
    pairs = parse_pairs(cfg.host_floor_pairs)
    additive = [str(g) for g in cfg.additive_types or []]
    fit = fit_table(table, pairs, int(cfg.holdout_every), additive)
    memory = {str(k): float(v) for k, v in (plain(cfg.gpu_memory_gib) or {}).items()}
    cluster = table_cluster(cfg, table, workload.app, memory)
    command = f"{COMMAND} table={cfg.table}" + "".join(
        f" {k}={cfg[k]}" for k in ("traces", "workload_file") if cfg.get(k)
    )
    meta = {
        "provenance": {
            "command": command.replace(" workload_file=", " workload="),
            "mode": "table",
            "source": describe_file(src),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "calibration": {
            "holdout": _holdout_summary(fit["holdout"]),
            "additive_types": additive,
            "convergence_traces": conv_report,
            "notes": notes,
        },
    }
    profile = write_profile(
        out,
        name=str(cfg.name),
        cluster=cluster,
        workload=workload,
        computes=fit["computes"],
        comms=fit["comms"],
        convergences=convergences,
        gpu_memory_gib=memory,
        meta=meta,
        model_extras=fit["extras"],
    )
    atomic_write_text(out / MEASUREMENTS_FILE, table.to_csv(index=False))
    return {"profile": profile, "fit": fit, "notes": notes, "convergence_traces": conv_report}


# --------------------------------------------------------------------------------------------
# Real mode
# --------------------------------------------------------------------------------------------


def overhead_schedule(cfg: DictConfig, workers: int) -> list[np.ndarray]:
    o = cfg.overhead
    batches = [int(b) for b in o.batches]
    every = int(o.change_every)
    return [
        np.full(workers, batches[(i // every) % len(batches)], dtype=np.int64)
        for i in range(int(o.intervals))
    ]


def real_workload(cfg: DictConfig, real: dict[str, Any], train_size: int) -> Workload:
    """The profile's workload: the real model and data set, sized from the model and the split."""
    from adapters.data import load_dataset
    from adapters.models import build_model

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
        "target_accuracy": float(real.get("target_accuracy", 0.95)),
        "num_classes": int(data.num_classes),
        "val_samples": int(data.x_val.shape[0]),
        "sample_bytes": float(4 * int(np.prod(data.input_shape))),
        "lr_rule": str(real.get("lr_rule", "adascale")),
        "initial_local_batch": int(real.get("initial_batch") or real.get("base_batch", 32)),
        "time_budget_s": float(real.get("time_budget_s", 600.0)),
        **overrides,
    }
    return workload_from_dict(wl)


def calibrate_real(cfg: DictConfig, out: Path) -> dict[str, Any]:
    import psutil

    from adapters.config import RealDDPConfig
    from adapters.ddp_backend import DDPBackend
    from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
    from dynamix_gym.measurement.profiling import (
        measure_curves,
        measure_overheads,
        profile_ladder,
        reference_rows,
        wait_for_quiet,
    )

    real = plain(cfg.real)
    workers = int(real["workers"])
    counts = sorted({int(w) for w in cfg.ladder.worker_counts} | {workers})
    quiet = None
    if cfg.quiet.enabled:
        q = cfg.quiet
        quiet = wait_for_quiet(float(q.threshold), float(q.hold_s), float(q.poll_s), float(q.max_wait_s))
    load_start = loadavg()
    # Profiling never stops at the accuracy target (the env would end the overhead episode).
    base = {**real, "target_accuracy": 1.0, "scenario": None, "emulate": None}
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
        gpu = main.spec.gpu_types[0]
        env = HeteroClusterEnv(
            backend=main, action_mode="absolute", interval=int(cfg.interval), reward="time"
        )

        def step(batches: np.ndarray):
            if getattr(env, "_episode_over", False) or not getattr(env, "_reset_done", False):
                env.reset(seed=int(cfg.seed))
            return env.step(batches.astype(np.float32))[4]["report"]

        env.reset(seed=int(cfg.seed))
        overheads = measure_overheads(
            step,
            overhead_schedule(cfg, workers),
            progress=bool(cfg.progress),
            budget_s=float(cfg.overhead.budget_s),
        )
        runs, curve_notes = [], []
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
        train_size = int(main.train_size)
    finally:
        for be in backends.values():
            be.close()
    load_end = loadavg()

    workload = real_workload(cfg, real, train_size)
    app = workload.app
    rows = reference_rows(
        ladder, app, f"{real['model']}/{real['dataset']} on {gpu} ranks ({real.get('dist_backend', 'gloo')})"
    )
    table = read_profile_table(pd.DataFrame(rows))
    # A CPU rank has no host pipeline beside its device: its whole fixed cost is compute.
    if cfg.additive_types is not None:
        additive = [str(g) for g in cfg.additive_types]
    else:
        additive = [gpu] if real.get("device", "cpu") == "cpu" else []
    fit = fit_table(table, parse_pairs(cfg.host_floor_pairs), int(cfg.holdout_every), additive)
    cap = (
        int(real.get("max_batch", 512))
        if isinstance(real.get("max_batch", 512), int)
        else max(real["max_batch"])
    )
    computes: list[ComputeParams] = []
    for p in fit["computes"]:
        if p.max_batch < cap:
            notes.append(
                f"{p.gpu}/{p.app}: measured up to local batch {p.max_batch}; the memory cap is set to the real "
                f"backend's max_batch {cap} (the compute model is extrapolated above {p.max_batch})"
            )
            p = replace(p, max_batch=cap)
        computes.append(p)

    conv_params, conv_report = [], None
    curves = [
        Curve(
            global_batch=r.global_batch,
            steps=np.array([x["steps"] for x in r.rows], dtype=np.float64),
            progress=np.array([x["progress"] for x in r.rows]),
            val_accuracy=np.array([x["val_accuracy"] for x in r.rows]),
            grad_sqr=np.array([x["grad_sqr"] for x in r.rows]),
            grad_var=np.array([x["grad_var"] for x in r.rows]),
            train_accuracy=np.array([x["train_accuracy"] for x in r.rows]),
            seed=r.seed,
        )
        for r in runs
        if len(r.rows) >= 2
    ]
    curves = [_fill_grad(c) for c in curves]
    if len({c.global_batch for c in curves}) >= 2:
        cf = fit_convergence_curves(
            curves,
            name=workload.convergence,
            base_batch=int(real.get("base_batch", 32)),
            acc_chance=1.0 / workload.num_classes,
            memory_fraction=float(cfg.curves.memory_fraction),
            bins=int(cfg.curves.bins),
            targets=[workload.target_quality],
            refit_targets=refit_targets(cfg, workload.target_quality),
        )
        conv_params = [cf.params]
        conv_report = {
            "rmse_binned": cf.rmse_binned,
            "rmse_raw": cf.rmse_raw,
            "rmse_by_global_batch": cf.rmse_by_batch,
            "steps_to_target": cf.steps_to_target,
            "grad_rmse_log_noise": cf.grad_rmse_log_noise,
            "notes": cf.notes,
        }
    else:
        workload = replace(workload, convergence="cifar10")
        notes.append(
            "no training curves at two or more batches (curves.enabled=false or out of time): the workload "
            "borrows the shipped cifar10 convergence model, so simulated accuracy is not this workload's"
        )
    mem_total = psutil.virtual_memory().total / 2**30
    cluster = ClusterSpec(
        name=str(cfg.name),
        nodes=(
            ProfiledNodeSpec(
                gpu=gpu,
                gpus=workers,
                cpu_cores=os.cpu_count() or 1,
                host_mem_gib=mem_total,
                mem_gib=mem_total / workers,
            ),
        ),
    )
    cvs = [p["step_cv"] for p in ladder.points if p["workers"] == workers and math.isfinite(p["step_cv"])]
    simulator = {
        "reconfig_delay_s": overheads.reconfig_delay_s,
        "interval_overhead_s": overheads.interval_overhead_s,
        "min_batch": int(real.get("min_batch", 8))
        if isinstance(real.get("min_batch", 8), int)
        else max(real["min_batch"]),
    }
    meta = {
        "provenance": {
            "command": COMMAND + _overrides_text(),
            "mode": "real",
            "real_config": real,
            "interval": int(cfg.interval),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "quiet_wait": quiet,
            "cpu_count": os.cpu_count(),
        },
        "measured": {"compute_noise_cv": float(np.median(cvs)) if cvs else None},
        "calibration": {
            "ladder": {"message": ladder.message(), "stopped_early": ladder.stopped_early, "skipped": ladder.skipped,
                       "elapsed_s": ladder.elapsed_s, "budget_s": ladder.budget_s},
            "holdout": _holdout_summary(fit["holdout"]),
            "additive_types": additive,
            "overheads": {"interval_overhead_s": overheads.interval_overhead_s,
                          "reconfig_delay_s": overheads.reconfig_delay_s, "samples": overheads.samples},
            "convergence": conv_report,
            "notes": notes,
        },
    }  # fmt: skip
    profile = write_profile(
        out,
        name=str(cfg.name),
        cluster=cluster,
        workload=workload,
        computes=computes,
        comms=fit["comms"],
        convergences=conv_params,
        simulator=simulator,
        meta=meta,
        model_extras=fit["extras"],
    )
    atomic_write_text(out / MEASUREMENTS_FILE, table.to_csv(index=False))
    atomic_write_text(out / "ladder_intervals.csv", pd.DataFrame(ladder.intervals).to_csv(index=False))
    if runs:
        curve_rows = [
            {"local_batch": r.local_batch, "global_batch": r.global_batch, "seed": r.seed, **x}
            for r in runs
            for x in r.rows
        ]
        atomic_write_text(out / "curves.csv", pd.DataFrame(curve_rows).to_csv(index=False))
    return {"profile": profile, "fit": fit, "notes": notes, "ladder": ladder, "overheads": overheads}


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


def _holdout_summary(h: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in h.items() if k not in ("rows", "fit")} | {"n_rows": len(h.get("rows", []))}


def _overrides_text() -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        over = list(HydraConfig.get().overrides.task)
    except ValueError:
        over = []
    return "".join(f" {o}" for o in over)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def report_markdown(profile: ClusterProfile, fit: dict[str, Any], notes: list[str]) -> str:
    meta = profile.meta
    prov = meta.get("provenance", {})
    lines = [
        f"# Cluster profile `{profile.name}`",
        "",
        f"Regenerate: `{prov.get('command', COMMAND)}`",
        "",
        f"Mode: {prov.get('mode')}; created {prov.get('created_utc')}"
        + (
            f"; load average {prov['loadavg_start']} -> {prov['loadavg_end']}"
            if "loadavg_start" in prov
            else ""
        ),
        "",
        f"Cluster: {', '.join(f'{n.gpus} x {n.gpu}' for n in profile.cluster.nodes)}; workload "
        f"`{profile.workload.name}` (app `{profile.workload.app}`, convergence `{profile.workload.convergence}`).",
        f"Simulator settings: {dict(profile.simulator) or 'defaults'}.",
        "",
        "## Compute models (T_compute(b) = smooth_max(host_s, alpha_s + beta_s b^exponent, k))",
        "",
        "| worker | app | alpha_s | beta_s | exponent | host_s | k | max batch | LOO MdAPE % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (g, a), p in sorted(profile.compute.items()):
        lines.append(
            f"| {g} | {a} | {p.alpha_s:.4g} | {p.beta_s:.4g} | {p.exponent:.3g} | {p.host_s:.4g} | {p.k:.3g} | "
            f"{p.max_batch} | {100 * p.loo_mdape:.1f} |"
        )
    additive = (meta.get("calibration") or {}).get("additive_types") or []
    if additive:
        lines += ["", f"Fitted without a host floor: {', '.join(additive)} ({ADDITIVE_RULE})."]
    lines += [
        "",
        "## All-reduce models",
        "",
        "| worker | app | alpha_intra_s | beta_intra_s | gamma | fit MAPE % |",
        "|---|---|---|---|---|---|",
    ]
    for (g, a), p in sorted(profile.comm.items()):
        lines.append(
            f"| {g} | {a} | {p.alpha_intra_s:.4g} | {p.beta_intra_s:.4g} | {p.gamma:.3g} | {100 * p.fit_mape:.1f} |"
        )
    h = fit["holdout"]
    lines += ["", "## Held-out step times (fit on part of the batch ladder, predict the rest)", ""]
    if h.get("rows"):
        lines.append(
            f"Fit batches {h['fit_batches']}, held out {h['held_out_batches']}. MdAPE per worker type: "
            + ", ".join(f"{g} {100 * v:.1f} %" for g, v in h["mdape"].items())
            + "."
        )
    else:
        lines.append(f"Not computed: {h.get('error', 'no rows')}.")
    cal = meta.get("calibration", {})
    conv = cal.get("convergence")
    if conv:
        lines += [
            "",
            "## Convergence model from measured curves",
            "",
            f"Accuracy RMSE {100 * conv['rmse_raw']:.2f} points over every measured point "
            f"({100 * conv['rmse_binned']:.2f} on the binned curves); by global batch: "
            + ", ".join(f"{b}: {100 * v:.2f}" for b, v in conv["rmse_by_global_batch"].items())
            + ".",
        ]
        lines += [f"- {n}" for n in conv.get("notes", [])]
        for s in conv["steps_to_target"]:
            model_steps = "never" if s["model_steps"] is None else f"{s['model_steps']:.0f}"
            measured = "never" if s["measured_steps"] is None else f"{s['measured_steps']:.0f}"
            lines.append(
                f"- global batch {s['global_batch']} (seed {s['seed']}): steps to {s['target']:.3f} measured "
                f"{measured}, model {model_steps}"
            )
    traces = cal.get("convergence_traces")
    if traces:
        m = traces["metric"]
        unit = (
            f"{m['name']} (higher is {'better' if m['higher_is_better'] else 'worse'}, scale {m['scale']:g})"
        )
        lines += [
            "",
            "## Convergence model from traces",
            "",
            f"Metric {unit}; untrained {m['untrained']}; traces at global batches {traces['batches']} "
            f"({traces['source']['path']}).",
            f"Accuracy RMSE {traces['accuracy_rmse_metric']:.4g} {m['name']} "
            f"({traces['accuracy_rmse']:.4g} as a quality fraction); by global batch: "
            + ", ".join(
                f"{b}: {v / m['scale']:.4g}"
                for b, v in sorted(traces["accuracy_rmse_by_batch"].items(), key=_batch)
            )
            + ".",
            "",
            f"| target {m['name']} | batches | trace epochs | model epochs | Kendall tau | Spearman rho |",
            "|---|---|---|---|---|---|",
        ]
        for o in traces["ordering"]:
            lines.append(
                f"| {o['target_metric']:.4g} | {o['batches']} | {o['trace_epochs']} | {o['model_epochs']} "
                f"| {_fmt(o['kendall_tau'])} | {_fmt(o['spearman_rho'])} |"
            )
        lines += [f"- {n}" for n in traces.get("notes", [])]
    figures = fit_figures(profile, traces)
    lines += [
        "",
        "## Fit figures",
        "",
        "Step-time leave-one-batch-out MdAPE per worker type: "
        + ", ".join(f"{g} {100 * v:.1f} %" for g, v in figures["step_time_loo_mdape"].items())
        + ".",
    ]
    if "accuracy_rmse" in figures:
        lines.append(
            f"Accuracy RMSE {figures['accuracy_rmse_metric']:.4g} {figures['metric']}; epochs-to-target "
            "Kendall tau: "
            + ", ".join(f"{t}: {_fmt(v)}" for t, v in figures["epochs_to_target_kendall_tau"].items())
            + "."
        )
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _batch(item: tuple[str, float]) -> int:
    return int(item[0])


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.2f}"


def calibrate(cfg: DictConfig) -> float:
    """Write the profile into a temporary sibling of the output directory and move it in place
    when everything is written: a failure (a bad table, a fit that cannot be done) leaves the
    output directory as it was, with nothing half-written."""
    out = out_dir_of(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        result = calibrate_from_table(cfg, tmp) if cfg.get("table") else calibrate_real(cfg, tmp)
        profile, fit = result["profile"], result["fit"]
        atomic_write_text(tmp / "calibration.md", report_markdown(profile, fit, result["notes"]))
        atomic_write_text(
            tmp / "calibration.json",
            dump_json(
                {
                    "holdout": {k: v for k, v in fit["holdout"].items() if k != "fit"},
                    "compute": [asdict(p) for p in profile.compute.values()],
                    "comm": [asdict(p) for p in profile.comm.values()],
                    "convergence_traces": result.get("convergence_traces"),
                    "figures": fit_figures(profile, result.get("convergence_traces")),
                    "notes": result["notes"],
                }
            ),
        )
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    mdape = float(fit["holdout"].get("mdape_all", math.nan))
    log.info(
        "profile %s written to %s; held-out step-time MdAPE %s",
        profile.name,
        shown(out),
        ", ".join(f"{g} {100 * v:.1f}%" for g, v in fit["holdout"].get("mdape", {}).items()) or "n/a",
    )
    for note in result["notes"]:
        log.warning("%s", note)
    return mdape


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished directory ``src`` to ``dst``; a previous ``dst`` is removed only after."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def workload_argument(argv: list[str]) -> list[str]:
    """``workload=<yaml or preset>`` on the command line means ``workload_file=...``: ``workload``
    is a config group elsewhere, and here also the real mode's workload fields (``workload.name=``)."""
    return [f"workload_file={a.split('=', 1)[1]}" if a.startswith("workload=") else a for a in argv]


@hydra.main(version_base=None, config_path="../conf", config_name="calibrate")
def main(cfg: DictConfig) -> float:
    return calibrate(cfg)


if __name__ == "__main__":
    sys.argv = workload_argument(sys.argv)
    main()
