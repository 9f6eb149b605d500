"""Fit the calibrated profile's convergence model to the real batch-schedule runs.

    python -m experiments.fit_schedules [fit_seeds=[0,1]] [out_profile=DIR] [report=FILE]

Reads the real runs of ``python -m experiments.schedules`` (``runs_dir``), fits the parameters
that govern schedules (:mod:`sim.fitting.schedules`) on the runs of ``fit_seeds``, scores the fit
on the other seeds (held out) and on the profile's own calibration curves (``curves.csv``), and
writes a copy of the profile with the refitted convergence model (``out_profile``) plus a report.
The shipped workloads' models (``sim/data``, ``results/fit``) are not touched: no schedule data
exists for them. Compare the refit in the simulator with
``python -m experiments.schedules sim_profile=<out_profile> sim_label=sim_refit report=...``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from experiments.calibration.fit import refit_compute_knee
from experiments.common import atomic_write_text, write_profile_copy
from experiments.reports.markdown import table
from experiments.schedules import LADDER_FILE
from sim.convergence import CONVERGENCE_MODELS_FILE
from sim.datafiles import dump_json
from sim.fitting.schedules import (
    FIT_PARAMETERS,
    TRAINED_PEAK,
    ScheduleRun,
    at_bounds,
    calibration_runs,
    fit_schedules,
    rmse,
    trained,
)
from sim.hardware import ComputeModel, ComputeParams
from sim.profile import load_profile

COMMAND = "python -m experiments.fit_schedules"


def load_schedule_runs(out_dir: Path, backend: str = "real") -> list[ScheduleRun]:
    """The ``backend`` runs saved by ``experiments.schedules`` under ``out_dir`` (K from its schedules.json)."""
    meta = out_dir / "schedules.json"
    if not meta.exists():
        raise FileNotFoundError(f"{meta} does not exist: run python -m experiments.schedules first")
    interval = int(json.loads(meta.read_text())["interval"])
    runs = []
    for path in sorted((out_dir / "runs").glob(f"{backend}-*.json")):
        rec = json.loads(path.read_text())
        tl = rec["timeline"]
        runs.append(ScheduleRun(
            name=rec["schedule"], regime=rec["regime"], seed=int(rec["seed"]), iterations=interval,
            global_batch=np.array([r["global_batch"] for r in tl], dtype=float),
            val_accuracy=np.array([r["val_accuracy"] for r in tl], dtype=float),
        ))  # fmt: skip
    if not runs:
        raise FileNotFoundError(
            f"no {backend} runs under {out_dir / 'runs'}: run python -m experiments.schedules"
        )
    return runs


def same_day_step_times(out_dir: Path, interval: int) -> tuple[np.ndarray, np.ndarray, float]:
    """From the real static runs of the campaign: at each local batch the median over intervals of
    the slowest rank's compute time per iteration (what the iteration waits for: at local 256 the
    ranks part by 30-45 % on this machine, at <= 128 by 1-4 %), and the median per-interval
    overhead (interval time minus K iterations), warm-up intervals excluded."""
    comp: dict[int, list[float]] = {}
    overhead: list[float] = []
    for path in sorted((out_dir / "runs").glob("real-*.json")):
        rec = json.loads(path.read_text())
        if rec.get("kind") != "static":
            continue
        for row in rec["timeline"][1:]:
            n = sum(1 for k in row if k.endswith("_compute_time_s"))
            comp.setdefault(int(row["w0_batch"]), []).append(
                max(row[f"w{i}_compute_time_s"] for i in range(n))
            )
            overhead.append(row["interval_time_s"] - interval * row["w0_iteration_time_s"])
    if len(comp) < 3:
        raise ValueError(
            f"same-day step times need static real runs at >= 3 local batches, found {sorted(comp)}"
        )
    b = np.array(sorted(comp), dtype=float)
    return b, np.array([np.median(comp[int(x)]) for x in b]), float(np.median(overhead))


def refit_step_times(profile_dir: Path, out_dir: Path, interval: int) -> dict[str, Any]:
    """Replace ``profile_dir``'s compute model and interval overhead by the same-day fit (in place):
    :func:`experiments.calibration.fit.refit_compute_knee` on :func:`same_day_step_times`."""
    b, t, overhead = same_day_step_times(out_dir, interval)
    refit = refit_compute_knee(
        profile_dir, b, t, f"{COMMAND} (same-day step times from the static real runs)"
    )
    prof = json.loads((profile_dir / "profile.json").read_text())
    before = float(prof["simulator"]["interval_overhead_s"])
    prof["simulator"]["interval_overhead_s"] = overhead
    (profile_dir / "profile.json").write_text(dump_json(prof))
    ladder_file = out_dir / LADDER_FILE
    ladder = json.loads(ladder_file.read_text()) if ladder_file.exists() else None
    return {"batches": b.tolist(), "compute_s": t.tolist(), "overhead_s": (before, overhead), "ladder": ladder,
            **refit}  # fmt: skip


def seed_spread_rmse(runs: list[ScheduleRun]) -> tuple[float, int]:
    """The floor of any noise-free model on ``runs``: RMSE (accuracy fraction) of each run against
    the interval-wise mean of the other seeds of its schedule and batch (over their common length),
    and the number of intervals compared."""
    errs = []
    for r in runs:
        others = [o for o in runs if o.name == r.name and o.regime == r.regime and o.seed != r.seed]
        if not others:
            continue
        n = min(len(r.val_accuracy), *(len(o.val_accuracy) for o in others))
        errs.append(r.val_accuracy[:n] - np.mean([o.val_accuracy[:n] for o in others], axis=0))
    if not errs:
        return math.nan, 0
    e = np.concatenate(errs)
    return float(np.sqrt(np.mean(e**2))), int(e.size)


def floor_lines(groups: dict[str, list[ScheduleRun]]) -> list[str]:
    calib = trained(groups.get("the profile's calibration curves (static, adascale)", []))
    sched = groups.get("held-out seeds", []) + groups.get("fit seeds", [])
    rows = []
    for label, runs in (
        ("the calibration curves that trained", calib),
        ("the schedule runs (all seeds)", sched),
    ):
        spread, n = seed_spread_rmse(runs)
        rows.append([label, n, _pts(spread)])
    return [
        "What no noise-free model can beat: each run against the mean of the other seeds of the same",
        "configuration (RMSE, accuracy points), the spread between seeds alone:",
        "",
        *table(["runs", "intervals", "seed-to-seed RMSE"], rows),
        "",
    ]


def decision_lines(fit: Any) -> list[str]:
    """What the refit says about the model's treatment of a changing batch, read off its values."""
    a, b = fit.params, fit.before
    mem_runs = a.batch_memory_progress / a.shape_x[-1]
    out = ["## Decision", ""]
    if mem_runs >= 1.0:
        out.append(
            f"- Batch memory: {a.batch_memory_progress:.4g} base steps, {mem_runs:.1f}x the progress to the plateau "
            f"(was {b.batch_memory_progress:.4g}): in these runs the attainable accuracy is set by the batch the run "
            "started with, and a later change of batch does not move it; a late larger batch costs no accuracy "
            f"(gap per doubling {100 * a.gap_per_doubling:.2f} points). Smith et al.'s finding holds here; the "
            "model's fast memory did not."
        )
    else:
        out.append(f"- Batch memory: {a.batch_memory_progress:.4g} base steps ({mem_runs:.2f}x the progress to the "
                   "plateau): a new batch's effect on the attainable accuracy sets in within the run.")  # fmt: skip
    if a.lr_stable_gain is not None:
        out.append(
            f"- Learning-rate limit: a rule that raises the learning rate loses progress beyond {a.lr_stable_gain:.3g}x "
            f"the base rate (exponent {a.lr_unstable_exponent:.2f}): the real AdaScale runs at large batches are "
            "slower than no scaling, which the model without the limit (AdaScale >= every rule) cannot express."
        )
    else:
        out.append("- Learning-rate limit: none needed (the fit put it beyond every batch of the runs).")
    out += [
        f"- Gradient-noise scale x{math.exp(a.log_grad_var[0] - b.log_grad_var[0]):.3g} over the calibration's estimate.",
        "- The shipped workloads' models are not changed: these runs are MNIST on CPU ranks and say nothing "
        "measured about their constants; the benchmark's committed results stand as scored.",
        "",
    ]
    return out


def _num(x: float | None) -> str:
    return "none (no limit)" if x is None else f"{x:.4g}"


def _pts(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.1f}"


def step_lines(steps: dict[str, Any] | None) -> list[str]:
    if steps is None:
        return ["Step times: the profile's (same_day_step_times=false).", ""]
    a, z, fit = steps["before"], steps["after"], steps["fit"]
    model = ComputeModel(
        ComputeParams(**{k: v for k, v in z.items() if k in ComputeParams.__dataclass_fields__})
    )
    rows = [[int(b), f"{1000 * t:.2f}", f"{1000 * float(model.compute_time_s(b)):.2f}", f"{100 * r:+.1f}"]
            for b, t, r in zip(steps["batches"], steps["compute_s"], fit["residual"], strict=True)]  # fmt: skip
    knee = z.get("knee_batch")
    knee_text = (f"+ {1e3 * z['knee_beta_s']:.4f} ms/sample past local batch {knee:g}" if knee is not None
                 else "no knee")  # fmt: skip
    lines = [
        "Step times refitted from the campaign's own static real runs (what a ladder measured that day gives;",
        "the schedules whose batch changes are not used): median over intervals of the slowest rank's compute",
        "per iteration, the time the iteration waits for,",
        "",
        *table(["local batch", "measured (ms)", "model (ms)", "model error"], rows),
        "",
        f"compute model alpha {1000 * a['alpha_s']:.2f} -> {1000 * z['alpha_s']:.2f} ms, beta {1e3 * a['beta_s']:.4f} -> "
        f"{1e3 * z['beta_s']:.4f} ms/sample^e, exponent {a['exponent']:.3f} -> {z['exponent']:.3f}, {knee_text} "
        f"({fit['rule']}); interval overhead {steps['overhead_s'][0]:.3f} -> {steps['overhead_s'][1]:.3f} s.",
        "",
    ]
    lad = steps.get("ladder")
    if lad:
        lrows = [[r["local_batch"], f"{1e3 * r['measured_s']:.1f}", f"{1e3 * r.get('measured_max_s', math.nan):.1f}"]
                 for r in lad["rows"]]  # fmt: skip
        lines += [
            f"A finer ladder on the same backend at {lad['measured_utc']} (`ladder.enabled=true`; "
            f"{lad['intervals']} intervals of K = {lad['interval']} per batch, the first a warm-up; "
            f"1-minute load {lad['load_start']:.2f} -> {lad['load_end']:.2f}), not used by the fit:",
            "",
            *table(["local batch", "ranks' mean (ms)", "slowest rank (ms)"], lrows),
            "",
        ]
    return lines


def report(
    fit: Any, groups: dict[str, list[ScheduleRun]], cfg: DictConfig, steps: dict[str, Any] | None
) -> str:
    before, after = fit.before, fit.params
    rows = []
    for name in FIT_PARAMETERS:
        key = name.replace("log_", "")
        if name == "shape_scale":
            b, a = before.shape_x[-1], after.shape_x[-1]
            label = "shape end (progress to the plateau, base steps)"
        elif name == "log_noise_scale_factor":
            b, a = 1.0, math.exp(after.log_grad_var[0] - before.log_grad_var[0])
            label = "gradient-noise scale factor"
        else:
            b, a = getattr(before, key), getattr(after, key)
            label = key
        rows.append([label, _num(b), _num(a)])
    err = [[label, len(runs), _pts(rmse(before, runs)), _pts(rmse(after, runs))]
           for label, runs in groups.items() if runs]  # fmt: skip
    cmd = f"`{COMMAND} fit_seeds={list(cfg.fit_seeds)}`"
    return "\n".join([
        "# The calibrated profile's convergence model, refitted to real batch schedules",
        "",
        f"Regenerate: {cmd} (after `python -m experiments.schedules`). Fitted on the real runs of seeds "
        f"{list(cfg.fit_seeds)} ({fit.runs} runs, {fit.points} intervals, both learning-rate rules); "
        "the other seeds are held out. The gradient-noise statistics stay as the calibration fitted them.",
        "",
        *table(["parameter", "profile", "refit"], rows),
        "",
        "Parameters that ended on a bound (the data ask for more than the model allows): "
        + ("; ".join(at_bounds(fit)) or "none") + ".",
        "",
        "Validation-accuracy RMSE (accuracy points, noise-free model against each measured interval):",
        "",
        *table(["runs", "count", "profile", "refit"], err),
        "",
        *floor_lines(groups),
        *decision_lines(fit),
        *step_lines(steps),
        f"The refitted profile: `{cfg.out_profile}` (a copy of `{cfg.profile}` with its "
        f"`{CONVERGENCE_MODELS_FILE}` replaced). The shipped workloads' models are unchanged.",
        "",
    ])  # fmt: skip


def fit_schedules_app(cfg: DictConfig) -> float:
    profile_dir = Path(to_absolute_path(str(cfg.profile)))
    profile = load_profile(profile_dir)
    runs_root = Path(to_absolute_path(str(cfg.runs_dir)))
    runs = load_schedule_runs(runs_root)
    fit_seeds = {int(s) for s in cfg.fit_seeds}
    train = [r for r in runs if r.seed in fit_seeds]
    held = [r for r in runs if r.seed not in fit_seeds]
    if not train:
        raise ValueError(
            f"fit_seeds={sorted(fit_seeds)} select no run; the runs have seeds {sorted({r.seed for r in runs})}"
        )
    name = profile.workload.convergence
    params = profile.convergence_params(name)
    fit = fit_schedules(params, train)
    calib = calibration_runs(profile_dir / "curves.csv")
    groups: dict[str, list[ScheduleRun]] = {}
    for label, sel in (("fit seeds", train), ("held-out seeds", held)):
        groups[label] = sel
        for regime in sorted({r.regime for r in sel}):
            groups[f"{label}, {regime}"] = [r for r in sel if r.regime == regime]
        groups[f"{label}, batch changes during the run"] = [
            r for r in sel if len(set(r.global_batch[1:])) > 1
        ]
    groups["the profile's calibration curves (static, adascale)"] = calib
    groups["the calibration curves below global batch 1024"] = [r for r in calib if r.global_batch[0] < 1024]
    groups[f"the calibration curves that trained (peak accuracy >= {TRAINED_PEAK})"] = trained(calib)
    steps = write_profile_copy(
        profile_dir, Path(to_absolute_path(str(cfg.out_profile))), fit.params, COMMAND,
        (lambda tmp: refit_step_times(tmp, runs_root, runs[0].iterations)) if cfg.same_day_step_times else None,
    )  # fmt: skip
    atomic_write_text(Path(to_absolute_path(str(cfg.report))), report(fit, groups, cfg, steps))
    return float(rmse(fit.params, held)) if held else float(fit.rmse_after)


@hydra.main(version_base="1.3", config_path="../conf", config_name="fit_schedules")
def main(cfg: DictConfig) -> float:
    return fit_schedules_app(cfg)


if __name__ == "__main__":
    main()
