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

``refit_convergence=true`` refits the convergence model of the real profile in ``out_dir`` from the
curves it measured (``curves.csv``), after a change of the model or its fit, measuring nothing.

``report_only=true`` re-renders ``calibration.md`` of the profile in ``out_dir`` from its saved
files (``profile.json``, ``calibration.json``), measuring and fitting nothing.

Modes: :mod:`experiments.calibration.real`, :mod:`experiments.calibration.table`; shared fits
:mod:`experiments.calibration.fit`; report :mod:`experiments.reports.calibration_report`.

Returns the held-out step-time MdAPE (pooled over worker types).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from experiments.calibration.fit import fit_figures
from experiments.calibration.real import calibrate_real
from experiments.calibration.table import calibrate_from_table
from experiments.common import atomic_write_text, shown
from experiments.reports.calibration_report import report_markdown
from sim.datafiles import data_path, dump_json
from sim.profile import PROFILES_DIR, ClusterProfile, load_profile

log = logging.getLogger(__name__)


def out_dir_of(cfg: DictConfig) -> Path:
    if cfg.get("out_dir"):
        return Path(to_absolute_path(str(cfg.out_dir)))
    return data_path(PROFILES_DIR) / str(cfg.name)


def calibration_record(profile: ClusterProfile, result: dict[str, Any]) -> dict[str, Any]:
    """``calibration.json``: the held-out check, the fitted models, the traces' fit, the figures."""
    fit = result["fit"]
    return {
        "holdout": {k: v for k, v in fit["holdout"].items() if k != "fit"},
        "compute": [asdict(p) for p in profile.compute.values()],
        "comm": [asdict(p) for p in profile.comm.values()],
        "convergence_traces": result.get("convergence_traces"),
        "figures": fit_figures(profile, result.get("convergence_traces")),
        "notes": result["notes"],
    }


def calibrate(cfg: DictConfig) -> float:
    """Write the profile into a temporary sibling of the output directory and move it in place
    when everything is written: a failure (a bad table, a fit that cannot be done) leaves the
    output directory as it was, with nothing half-written."""
    out = out_dir_of(cfg)
    if cfg.get("report_only"):
        return rerender(out)
    if cfg.get("refit_convergence"):
        return refit_convergence(out, cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        result = calibrate_from_table(cfg, tmp) if cfg.get("table") else calibrate_real(cfg, tmp)
        profile, fit = result["profile"], result["fit"]
        atomic_write_text(tmp / "calibration.md", report_markdown(profile, fit, result["notes"]))
        atomic_write_text(tmp / "calibration.json", dump_json(calibration_record(profile, result)))
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


def rerender(out: Path) -> float:
    """``report_only=true``: ``calibration.md`` rebuilt from the profile and ``calibration.json``."""
    profile = load_profile(out)
    record = json.loads((out / "calibration.json").read_text())
    atomic_write_text(out / "calibration.md", report_markdown(profile, record, record["notes"]))
    log.info("calibration report of %s re-rendered in %s", profile.name, shown(out))
    return float(record["holdout"].get("mdape_all") or math.nan)


def refit_convergence(out: Path, cfg: DictConfig) -> float:
    """``refit_convergence=true``: the convergence model of the real profile in ``out`` refitted from
    its measured curves (:func:`experiments.calibration.real.refit_convergence_dir`), on a copy
    that replaces the directory only when the refit and its report are written."""
    from experiments.calibration.real import refit_convergence_dir

    if not (out / "profile.json").is_file():
        raise FileNotFoundError(
            f"refit_convergence=true: no profile in {out} (set out_dir= to a profile directory)"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        shutil.copytree(out, tmp, dirs_exist_ok=True)
        report = refit_convergence_dir(cfg, tmp)
        rerender(tmp)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for note in report["notes"]:
        log.info("%s", note)
    log.info("convergence model of %s refitted from its curves", shown(out))
    return float(report["rmse_raw"])


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
