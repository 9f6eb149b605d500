"""The step-time fits both calibration modes share: every (worker type, app) of a validated table
fitted (:func:`sim.fitting.step_time.fit_models`) with the held-out check beside it, the
``host_floor_pairs`` setting, and the figures every fit report gives; and the refit of a written
profile's compute model with a knee (:func:`refit_compute_knee`: same-day step times of
``experiments.fit_schedules``, the quick ladder before a deploy) and of its one-node all-reduce
(:func:`refit_comm_intra_file`: the quick ladder's step times)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from sim.datafiles import atomic_write_text, dump_json
from sim.fitting.comm import refit_comm_intra
from sim.fitting.step_time import fit_compute_knee, fit_models, holdout_errors
from sim.hardware import ComputeParams
from sim.network import CommParams
from sim.profile import COMM_FILE, COMPUTE_FILE, ClusterProfile

#: The calibration app (its reports quote the command that regenerates them).
COMMAND = "python -m experiments.calibrate"


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


def parse_pairs(items: Any) -> tuple[tuple[str, str], ...]:
    """``["V100/cifar10", ...]`` (or ``[[gpu, app], ...]``) -> ``(("V100", "cifar10"), ...)``."""
    out = []
    for item in items or ():
        parts = item.split("/") if isinstance(item, str) else [str(x) for x in item]
        if len(parts) != 2 or not all(s.strip() for s in parts):
            raise ValueError(f"host_floor_pairs entries must be 'GPU/app', got {item!r}")
        out.append((parts[0].strip(), parts[1].strip()))
    return tuple(out)


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


def holdout_summary(h: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in h.items() if k not in ("rows", "fit")} | {"n_rows": len(h.get("rows", []))}


def refit_compute_knee(
    profile_dir: str | Path,
    local_batch: Sequence[float],
    compute_time_s: Sequence[float],
    generated_by: str,
    gpu: str | None = None,
    app: str | None = None,
) -> dict[str, Any]:
    """Replace, in place, the compute model of ``(gpu, app)`` (``None``: the only one) in the profile
    directory ``profile_dir`` by :func:`sim.fitting.step_time.fit_compute_knee` on the measured
    compute times per iteration (knee included when :data:`~sim.fitting.step_time.KNEE_RULE` keeps
    one); its memory cap stays. Returns the model ``before``, the model ``after`` and the ``fit``'s
    figures."""
    path = Path(profile_dir) / COMPUTE_FILE
    rows = json.loads(path.read_text())["models"]
    match = [i for i, r in enumerate(rows) if gpu in (None, r["gpu"]) and app in (None, r["app"])]
    if len(match) != 1:
        raise ValueError(
            f"{path}: {len(match)} compute models match (gpu={gpu}, app={app}), of "
            f"{[(r['gpu'], r['app']) for r in rows]}; the refit replaces exactly one"
        )
    old = rows[match[0]]
    params, fit = fit_compute_knee(local_batch, compute_time_s, old["gpu"], old["app"], int(old["max_batch"]))
    rows[match[0]] = asdict(params)
    atomic_write_text(path, dump_json({"generated_by": generated_by, "models": rows}))
    return {"before": old, "after": asdict(params), "fit": fit}


def refit_comm_intra_file(
    profile_dir: str | Path,
    local_batch: Sequence[float],
    step_time_s: Sequence[float],
    replicas: int,
    generated_by: str,
    gpu: str,
    app: str,
) -> dict[str, Any]:
    """Replace, in place, the one-node all-reduce latency and overlap of ``(gpu, app)`` in the
    profile directory ``profile_dir`` by :func:`sim.fitting.comm.refit_comm_intra` on step times
    measured with ``replicas`` ranks on one node, against the directory's (refitted) compute model;
    the per-replica and inter-node terms stay. Returns the model ``before``, the model ``after`` and
    the ``fit``'s figures (step-time MAPE on the ladder before and after, whether the stored pair was
    kept)."""
    root = Path(profile_dir)
    compute_rows = json.loads((root / COMPUTE_FILE).read_text())["models"]
    compute = [r for r in compute_rows if (r["gpu"], r["app"]) == (gpu, app)]
    path = root / COMM_FILE
    doc = json.loads(path.read_text())
    rows = doc["models"]
    match = [i for i, r in enumerate(rows) if (r["gpu"], r["app"]) == (gpu, app)]
    if len(compute) != 1 or len(match) != 1:
        raise ValueError(
            f"{root}: {len(compute)} compute and {len(match)} comm models of ({gpu}, {app}); the refit replaces "
            "exactly one comm model against exactly one compute model"
        )
    old = rows[match[0]]
    params, fit = refit_comm_intra(
        local_batch, step_time_s, replicas, ComputeParams(**compute[0]), CommParams(**old)
    )
    rows[match[0]] = asdict(params)
    atomic_write_text(path, dump_json({**doc, "generated_by": generated_by, "models": rows}))
    return {"before": old, "after": asdict(params), "fit": fit}
