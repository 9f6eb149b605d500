"""Refit a profile's convergence model to the real runs of earlier deploy campaigns.

    python -m experiments.fit_campaigns profile=results/lm/profile_2 \
        'campaigns=[results/deploy/lm_*]' 'held_out=[results/deploy/lm_19,results/deploy/lm_20]' \
        out_profile=results/lm/profile_3 report=results/lm/campaign_fit.md

A profile's convergence model is fitted to static-batch curves (``python -m experiments.calibrate``),
which cannot tell how a *change* of batch acts: a larger batch that makes proportionally more
progress but stretches the progress a target needs fits them as well as one that makes less
progress. The real runs of the fidelity app's campaigns (``python -m experiments.fidelity``, each
campaign's ``timelines.csv``) include learned controllers and DLB, whose batches change every few
intervals; this app refits the parameters that set the number of intervals to the target
(:data:`sim.fitting.schedules.TARGET_PARAMETERS`) to the intervals those runs took
(:func:`sim.fitting.schedules.fit_intervals_to_target`), scores the fit on held-out campaigns, and
writes a copy of the profile with the refitted model. Intervals, not seconds: the fit is of the
convergence model alone (the step times are the quick calibration's, measured right before a run).
Runs the guards rolled back, or that never reached the target, are left out (and counted).
"""

from __future__ import annotations

import glob
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from experiments.common import atomic_write_text, shown, write_profile_copy
from experiments.reports.markdown import table
from sim.convergence import CONVERGENCE_MODELS_FILE, ConvergenceParams
from sim.fitting.schedules import (
    TARGET_PARAMETERS,
    ScheduleRun,
    TargetFit,
    calibration_runs,
    crossing,
    fit_intervals_to_target,
    interval_residuals,
    model_intervals,
    rmse,
    trained,
)
from sim.profile import load_profile

COMMAND = "python -m experiments.fit_campaigns"
TIMELINES = "timelines.csv"


def campaign_dirs(patterns: list[str]) -> list[Path]:
    """The campaign directories ``patterns`` name (paths or globs), each holding a ``timelines.csv``,
    in natural order (lm_2 before lm_10), each once."""
    out: dict[Path, None] = {}
    for pat in patterns:
        hits = sorted(glob.glob(to_absolute_path(str(pat))))
        if not hits:
            raise FileNotFoundError(f"campaigns: {pat!r} matches no directory")
        for h in hits:
            p = Path(h)
            if not (p / TIMELINES).exists():
                raise FileNotFoundError(
                    f"campaigns: {p} has no {TIMELINES} (not a fidelity campaign's out_dir)"
                )
            out[p] = None

    def natural(p: Path) -> list[Any]:
        import re

        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]

    return sorted(out, key=natural)


def campaign_setup(path: Path) -> dict[str, Any]:
    summary = path / "summary.json"
    if not summary.exists():
        raise FileNotFoundError(
            f"{summary} does not exist: the campaign's interval and target are read from it"
        )
    return json.loads(summary.read_text())["setup"]


def load_campaign_runs(
    path: Path, regime: str, backend: str = "real"
) -> tuple[list[ScheduleRun], dict[str, int]]:
    """The ``backend`` runs of one campaign as :class:`ScheduleRun` (named ``<campaign>:<controller>``),
    and the counts of those left out: rolled back by the guards (their accuracy jumps back), or never
    at the target."""
    setup = campaign_setup(path)
    k, target = int(setup["interval"]), float(setup["target_accuracy"])
    d = pd.read_csv(path / TIMELINES)
    d = d[d["backend"] == backend]
    runs, left = [], {"rolled back": 0, "never reached the target": 0}
    for (ctl, seed), g in d.groupby(["controller", "seed"], sort=True):
        g = g.sort_values("step")
        if g["guard_rollbacks"].fillna(0).to_numpy().max(initial=0) > 0:
            left["rolled back"] += 1
            continue
        run = ScheduleRun(f"{path.name}:{ctl}", regime, int(seed), k, g["global_batch"].to_numpy(float),
                          g["val_accuracy"].to_numpy(float))  # fmt: skip
        if math.isnan(crossing(run.val_accuracy, target)):
            left["never reached the target"] += 1
            continue
        runs.append(run)
    return runs, left


def by_controller(
    params: ConvergenceParams,
    after: ConvergenceParams,
    runs: list[ScheduleRun],
    target: float,
    max_gain: float | None,
) -> list[list[Any]]:
    """Per controller: runs, mean measured intervals to the target, the profile's and the refit's."""
    names = np.array([r.name.split(":", 1)[1] for r in runs])
    measured = np.array([crossing(r.val_accuracy, target) for r in runs])
    predicted = [model_intervals(p, runs, target, max_gain) for p in (params, after)]
    rows = []
    for ctl in sorted(set(names)):
        sel = names == ctl
        meas = measured[sel].mean()
        pred = [x[sel].mean() for x in predicted]
        rows.append([ctl, int(sel.sum()), f"{meas:.2f}", f"{pred[0]:.2f}", f"{pred[1]:.2f}"])
    return rows


def rms(params: ConvergenceParams, runs: list[ScheduleRun], target: float, max_gain: float | None) -> float:
    return (
        float(np.sqrt(np.mean(interval_residuals(params, runs, target, max_gain) ** 2))) if runs else math.nan
    )


def calibration_lines(
    fit: TargetFit, curves: Sequence[ScheduleRun], target: float, max_gain: float | None
) -> list[str]:
    """How the refit reads the profile's own static calibration curves, which its convergence model
    was first fitted to: accuracy RMSE over every interval of the curves that trained, and the RMS
    log error of the intervals to the target over those that reach it."""
    curves = trained(list(curves))
    if not curves:
        return ["The profile holds no calibration curve (`curves.csv`) to re-score.", ""]
    reaching = [r for r in curves if not math.isnan(crossing(r.val_accuracy, target))]
    b, a = fit.before, fit.params
    rows = [
        ["accuracy RMSE (points), every interval", len(curves), f"{100 * rmse(b, curves):.2f}",
         f"{100 * rmse(a, curves):.2f}"],
        ["RMS log error of the intervals to the target", len(reaching), f"{rms(b, reaching, target, max_gain):.3f}",
         f"{rms(a, reaching, target, max_gain):.3f}"],
    ]  # fmt: skip
    return [
        "The profile's own calibration curves (static batches; the curves that trained), which its model was "
        "first fitted to, read by the refit:",
        "",
        *table(["on the calibration curves", "curves", "profile", "refit"], rows),
        "",
    ]


def report(
    fit: TargetFit, cfg: DictConfig, target: float, train: list[ScheduleRun], held: list[ScheduleRun],
    fit_dirs: list[Path], held_dirs: list[Path], left: dict[str, int], max_gain: float | None,
    curves: Sequence[ScheduleRun] = (),
) -> str:  # fmt: skip
    b, a = fit.before, fit.params
    rows = [
        ["shape end (progress to the plateau, base steps)", f"{b.shape_x[-1]:.4g}", f"{a.shape_x[-1]:.4g}"],
        ["stretch exponent (per doubling of the remembered batch)", f"{b.stretch_exponent:.4g}",
         f"{a.stretch_exponent:.4g}"],
        ["batch memory (base steps)", f"{b.batch_memory_progress:.4g}", f"{a.batch_memory_progress:.4g}"],
        ["progress noise factor", f"{b.progress_noise_factor:.4g}", f"{a.progress_noise_factor:.4g}"],
    ]  # fmt: skip
    err = [
        ["fitted campaigns", len(train), f"{rms(b, train, target, max_gain):.3f}", f"{rms(a, train, target, max_gain):.3f}"],
        ["held-out campaigns", len(held), f"{rms(b, held, target, max_gain):.3f}", f"{rms(a, held, target, max_gain):.3f}"],
    ]  # fmt: skip
    names = ", ".join(p.name for p in fit_dirs)
    lines = [
        "# The convergence model's batch dependence, refitted to earlier campaigns' real runs",
        "",
        # the campaigns as resolved (a glob would pick up campaigns run since)
        f"Regenerate: `{COMMAND} profile={cfg.profile} 'campaigns=[{','.join(shown(p) for p in fit_dirs + held_dirs)}]' "
        f"'held_out=[{','.join(shown(p) for p in held_dirs)}]' out_profile={cfg.out_profile} report={cfg.report}`.",
        "",
        f"Fitted on the real runs of {len(fit_dirs)} campaigns ({names}): {len(train)} runs; held out: "
        f"{', '.join(p.name for p in held_dirs) or 'none'} ({len(held)} runs). Target: validation quality "
        f"{target:g}, counted in intervals (the crossing interpolated between interval ends); the model "
        f"replays each run's global batches (learning-rate cap {max_gain}, the guards'). Left out: "
        + "; ".join(f"{v} {k}" for k, v in left.items())
        + ".",
        "",
        *table(["parameter", "profile", "refit"], rows),
        "",
        "Parameters that ended on a bound: " + ("; ".join(fit.at_bounds) or "none") + ".",
        "",
        "RMS log error of the intervals to the target, run by run:",
        "",
        *table(["runs", "count", "profile", "refit"], err),
        "",
        "Mean intervals to the target per controller (measured; the model on the run's batches):",
        "",
        "Fitted campaigns:",
        "",
        *table(
            ["controller", "runs", "measured", "profile", "refit"],
            by_controller(b, a, train, target, max_gain),
        ),
        "",
    ]
    if held:
        lines += [
            "Held-out campaigns:",
            "",
            *table(
                ["controller", "runs", "measured", "profile", "refit"],
                by_controller(b, a, held, target, max_gain),
            ),
            "",
        ]
    lines += calibration_lines(fit, curves, target, max_gain)
    lines += [
        f"The refitted profile: `{cfg.out_profile}` (a copy of `{cfg.profile}` with its `{CONVERGENCE_MODELS_FILE}` "
        f"replaced; parameters fitted: {', '.join(TARGET_PARAMETERS)}). The gradient statistics, the ceiling and the "
        "shape's form stay as the static curves fitted them.",
        "",
    ]
    return "\n".join(lines)


def fit_campaigns_app(cfg: DictConfig) -> dict[str, float]:
    profile_dir = Path(to_absolute_path(str(cfg.profile)))
    profile = load_profile(profile_dir)
    params = profile.convergence_params(profile.workload.convergence)
    regime = str(profile.workload.lr_rule)
    held_dirs = campaign_dirs(list(cfg.held_out)) if cfg.held_out else []
    fit_dirs = [p for p in campaign_dirs(list(cfg.campaigns)) if p not in held_dirs]
    if not fit_dirs:
        raise ValueError("campaigns: no campaign left to fit on once held_out is taken out")
    targets = {float(campaign_setup(p)["target_accuracy"]) for p in fit_dirs + held_dirs}
    if len(targets) != 1:
        raise ValueError(
            f"the campaigns have different targets {sorted(targets)}: fit one job's campaigns at a time"
        )
    target = targets.pop()
    max_gain = None if cfg.max_lr_gain is None else float(cfg.max_lr_gain)
    left = {"rolled back": 0, "never reached the target": 0}
    sets: list[list[ScheduleRun]] = []
    for dirs in (fit_dirs, held_dirs):
        runs: list[ScheduleRun] = []
        for p in dirs:
            got, skipped = load_campaign_runs(p, regime, str(cfg.backend))
            runs += got
            for k, v in skipped.items():
                left[k] += v
        sets.append(runs)
    train, held = sets
    if not train:
        raise ValueError(f"no {cfg.backend} run of {[p.name for p in fit_dirs]} reached the target {target}")
    fit = fit_intervals_to_target(params, train, target, max_gain, grid=bool(cfg.grid))
    curves = calibration_runs(profile_dir / "curves.csv")
    write_profile_copy(profile_dir, Path(to_absolute_path(str(cfg.out_profile))), fit.params, COMMAND)
    atomic_write_text(
        Path(to_absolute_path(str(cfg.report))),
        report(fit, cfg, target, train, held, fit_dirs, held_dirs, left, max_gain, curves),
    )
    return {
        "fit_before": fit.rms_before,
        "fit_after": fit.rms_after,
        "held_before": rms(params, held, target, max_gain),
        "held_after": rms(fit.params, held, target, max_gain),
    }


@hydra.main(version_base=None, config_path="../conf", config_name="fit_campaigns")
def main(cfg: DictConfig) -> None:
    scores = fit_campaigns_app(cfg)
    print(
        "RMS log error of intervals to the target: fitted "
        f"{scores['fit_before']:.3f} -> {scores['fit_after']:.3f}, held out {scores['held_before']:.3f} -> "
        f"{scores['held_after']:.3f}; report {cfg.report}"
    )


if __name__ == "__main__":
    main()
