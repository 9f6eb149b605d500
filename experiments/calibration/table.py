"""Table mode of the calibration app: a measured table in the reference format
(``sim/data/reference/README.md``) fitted into a profile, with the cluster, the workload (a
``workload=`` file, a preset, or the table's application) and, with ``traces=``, its convergence
model fitted from traces."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from experiments.calibration.fit import COMMAND, fit_table, holdout_summary, parse_pairs
from experiments.common import atomic_write_text, describe_file, plain
from sim.cluster import ClusterSpec, NodeSpec, ProfiledNodeSpec
from sim.convergence import ConvergenceParams, convergence_table
from sim.fitting.convergence import fit_app
from sim.fitting.table import read_profile_table
from sim.hardware import GPU_MEMORY_GIB
from sim.profile import MEASUREMENTS_FILE, write_profile
from sim.specs_io import spec_from_dict, workload_from_dict, workload_to_dict
from sim.traces_table import app_spec, read_traces
from sim.workloads import WORKLOADS, Workload

log = logging.getLogger(__name__)


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
        # rows whose grad_sqr is 0 (clipped estimates), left out of the noise-scale fit
        "grad_sqr_zero_rows_left_out": [{"global_batch": b, "epoch": e} for b, e in fit.grad.left_out],
        "notes": fit.notes,
    }  # fmt: skip
    return workload, fit.params, report


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
        # the traces fit's notes (e.g. the rows the noise-scale fit left out) go to the report and the log
        notes.extend(conv_report["notes"])
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
            "holdout": holdout_summary(fit["holdout"]),
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
