"""Fits the simulator's gradient spread (:mod:`sim.convergence`: ``grad_norm_cv``) to real ranks.

    python -m experiments.fit_grad_spread timelines=[results/deploy/lm_16/timelines.csv] profile=results/lm/profile_2

Each real interval of a campaign's timelines reports, per rank, the mean and variance of its gradient
norm over the interval's K iterations (``w{i}_grad_norm_mean``, ``w{i}_grad_norm_var``). The simulator
draws each iteration's |g|^2 as its expected value times a mean-1 gamma factor; without a fit the
factor's shape is a constant (``GRAD_NOISE_DOF``: a norm spread of ~0.1 at every batch), which the
real ranks do not show. The fit regresses the log of the measured coefficient of variation
(sd / mean) on the log of the rank's local batch over the base batch, ``log cv = log c + e log(b /
M0)`` (least squares, scipy), skipping each run's first ``skip_first`` intervals (the start from
initialisation, where the norm falls within the interval: not modelled), then corrects ``c`` for the
K-sample estimator's bias (the simulator reports the same estimator over its own K draws: a Monte
Carlo of it at the fitted spread). It writes ``grad_norm_cv`` and ``grad_norm_cv_exponent`` into the
profile's convergence model and ``grad_spread.{json,md}`` beside it: the fit, its error on held-out
seeds against a spread that does not depend on the batch, and the measured, fitted and previously
simulated spreads per batch.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig
from scipy.stats import linregress

from experiments.common import atomic_write_text
from experiments.reports.markdown import overrides_text, table
from sim.convergence import (
    GRAD_NORM_CV_RANGE,
    GRAD_SPREAD_FIELDS,
    ConvergenceModel,
    ConvergenceParams,
    gamma_shape_for_norm_cv,
)
from sim.datafiles import dump_json
from sim.profile import CONVERGENCE_FILE, PROFILE_FILE, load_profile
from sim.validation import check_int

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.fit_grad_spread"
#: Batch bins of the report's table (local batch, upper edges).
BINS = (10, 20, 40, 80, 100_000)


def intervals(timelines: pd.DataFrame, backend: str, skip_first: int) -> pd.DataFrame:
    """One row per (run, interval, rank) of ``backend``: local batch ``b``, ``cv`` (sd / mean of the
    gradient norm) and ``k`` (the interval's position in its run, from 0); ranks that did not train
    (mean or variance 0) and each run's first ``skip_first`` intervals are left out."""
    need = {"controller", "backend", "seed", "step"}
    ranks = sorted({int(c[1:].split("_")[0]) for c in timelines.columns if c.endswith("_grad_norm_var")})
    if not ranks or need - set(timelines.columns):
        raise ValueError(
            f"timelines need columns {sorted(need)} and w<i>_batch, w<i>_grad_norm_mean, w<i>_grad_norm_var "
            "(campaigns from cc62c87 on record them)"
        )
    t = timelines[timelines.backend == backend].copy()
    t["k"] = t.groupby(["controller", "seed"]).step.rank(method="first").astype(int) - 1
    parts = []
    for i in ranks:
        d = t[
            ["controller", "seed", "step", "k", f"w{i}_batch", f"w{i}_grad_norm_mean", f"w{i}_grad_norm_var"]
        ]
        parts.append(
            d.set_axis(["controller", "seed", "step", "k", "b", "mean", "var"], axis=1).assign(rank=i)
        )
    d = pd.concat(parts, ignore_index=True)
    d = d[(d["mean"] > 0) & (d["var"] > 0) & (d.b > 0)]
    d = d.assign(cv=np.sqrt(d["var"]) / d["mean"])
    return d[d.k >= skip_first].reset_index(drop=True)


def interval_iterations(paths: list[Path], given: int | None) -> int:
    """K, the iterations per interval: ``given``, else the campaigns' own (``setup.interval`` of the
    ``summary.json`` beside each timelines file), which must agree."""
    if given is not None:
        return check_int("iterations", given, 2, 1_000_000)
    ks = set()
    for p in paths:
        summary = p.parent / "summary.json"
        if not summary.is_file():
            raise ValueError(f"iterations: {summary} is missing; give the campaign's K (iterations=...)")
        ks.add(int(json.loads(summary.read_text())["setup"]["interval"]))
    if len(ks) != 1:
        raise ValueError(f"iterations: the campaigns ran at different K {sorted(ks)}; fit them apart")
    return check_int("iterations", ks.pop(), 2, 1_000_000)


def estimator_bias(cv: float, iterations: int, rng: np.random.Generator, draws: int = 20_000) -> float:
    """exp(E log(sample cv / cv)): the K-sample estimate's log bias at spread ``cv`` (ddof 0, as both
    backends report it), by Monte Carlo with the simulator's gamma factors."""
    a = float(gamma_shape_for_norm_cv(cv))
    norms = np.sqrt(rng.gamma(a, 1.0 / a, (draws, iterations)))
    return float(np.exp(np.mean(np.log(norms.std(axis=1) / norms.mean(axis=1) / cv))))


def fit_spread(d: pd.DataFrame, base_batch: int, iterations: int, rng: np.random.Generator) -> dict[str, Any]:
    """The power law in the local batch, its estimator-bias correction and its standard errors."""
    x, y = np.log(d.b / base_batch), np.log(d.cv)
    fit = linregress(x, y) if x.nunique() > 1 else None
    slope = float(fit.slope) if fit is not None else 0.0
    intercept = float(fit.intercept) if fit is not None else float(y.mean())
    c = float(np.exp(intercept))
    for _ in range(3):  # fixed point: the measured level is the true one times the bias at it
        c = float(np.exp(intercept)) / estimator_bias(c, iterations, rng)
    lo, hi = GRAD_NORM_CV_RANGE
    if not lo <= c <= hi:
        raise ValueError(f"fitted grad_norm_cv {c:.4g} is outside the range the model allows [{lo}, {hi}]")
    resid = y - (intercept + slope * x)
    return {
        "grad_norm_cv": c,
        "grad_norm_cv_exponent": slope,
        "exponent_stderr": float(fit.stderr) if fit is not None else float("nan"),
        "measured_level": float(np.exp(intercept)),
        "estimator_bias": float(np.exp(intercept)) / c,
        "r2": float(fit.rvalue**2) if fit is not None else float("nan"),
        "rmse_log_cv": float(np.sqrt(np.mean(resid**2))),
    }


def held_out(d: pd.DataFrame, base_batch: int, folds: int) -> dict[str, float]:
    """RMSE of log cv on folds of seeds, each predicted by the power law fitted without it and by a
    constant spread (the median log cv without it)."""
    seeds = np.sort(d.seed.unique())
    err_fit, err_const = [], []
    for part in np.array_split(seeds, min(folds, len(seeds))):
        test, train = d[d.seed.isin(part)], d[~d.seed.isin(part)]
        if train.empty or test.empty:
            continue
        xt, yt = np.log(train.b / base_batch), np.log(train.cv)
        f = linregress(xt, yt) if xt.nunique() > 1 else None
        x, y = np.log(test.b / base_batch), np.log(test.cv)
        pred = f.intercept + f.slope * x if f is not None else np.full(len(y), yt.mean())
        err_fit.append((y - pred) ** 2)
        err_const.append((y - yt.mean()) ** 2)
    if not err_fit:
        return {"rmse_log_cv_power_law": float("nan"), "rmse_log_cv_constant": float("nan")}
    return {
        "rmse_log_cv_power_law": float(np.sqrt(np.concatenate(err_fit).mean())),
        "rmse_log_cv_constant": float(np.sqrt(np.concatenate(err_const).mean())),
    }


def by_batch(
    real: pd.DataFrame, sim: pd.DataFrame, model: ConvergenceModel, fit: dict[str, Any]
) -> list[list[str]]:
    """Per batch bin: the measured median spread, the fit's (the law at the bin's median batch times
    the estimator's bias) and the campaign's simulated median (the spread the simulator had)."""
    rows, lo = [], 0
    for hi in BINS:
        r, s = real[(real.b > lo) & (real.b <= hi)], sim[(sim.b > lo) & (sim.b <= hi)]
        if len(r):
            pred = float(model.grad_norm_cv_at(np.array([r.b.median()]))[0]) * fit["estimator_bias"]
            sim_cv = f"{s.cv.median():.3f}" if len(s) else "-"
            label = f"({lo}, {hi}]" if hi < BINS[-1] else f"> {lo}"
            rows.append([label, str(len(r)), f"{r.cv.median():.3f}", f"{pred:.3f}", sim_cv])
        lo = hi
    return rows


def write_model(profile_dir: Path, name: str, values: dict[str, float]) -> dict[str, Any]:
    """Set the spread fields of model ``name`` in the profile's convergence models (checked by
    building the model); returns the row before."""
    path = profile_dir / CONVERGENCE_FILE
    doc = json.loads(path.read_text())
    match = [i for i, r in enumerate(doc["models"]) if r["name"] == name]
    if len(match) != 1:
        raise ValueError(
            f"{path}: {len(match)} models named {name!r}, of {[r['name'] for r in doc['models']]}"
        )
    before = dict(doc["models"][match[0]])
    row = {**before, **values}
    ConvergenceParams(**row)  # the new row is a valid model
    doc["models"][match[0]] = row
    atomic_write_text(path, dump_json({**doc, "grad_spread_fitted_by": COMMAND}))
    return before


@hydra.main(version_base=None, config_path="../conf", config_name="fit_grad_spread")
def main(cfg: DictConfig) -> dict[str, Any]:
    skip = check_int("skip_first", cfg.skip_first, 0, 1000)
    folds = check_int("cv_folds", cfg.cv_folds, 2, 100)
    if not cfg.timelines:
        raise ValueError("timelines: give at least one campaign's timelines.csv")
    from hydra.utils import to_absolute_path

    paths = [Path(to_absolute_path(str(p))) for p in cfg.timelines]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"timelines: {p} does not exist")
    tl = pd.concat([pd.read_csv(p).assign(campaign=p.parent.name) for p in paths], ignore_index=True)
    tl["seed"] = tl.campaign + ":" + tl.seed.astype(str)  # seeds of different campaigns are different runs
    out = Path(to_absolute_path(str(cfg.profile)))
    profile = load_profile(out)
    name = cfg.workload or profile.workload.convergence
    if name not in profile.convergence:
        raise ValueError(
            f"workload: {out} holds convergence models {sorted(profile.convergence)}, not {name!r}"
        )
    model = ConvergenceModel(profile.convergence_params(name))
    base = model.base_batch
    every_real = intervals(tl, "real", 0)
    real = every_real[every_real.k >= skip]
    if len(real) < 10:
        raise ValueError(
            f"{len(real)} real intervals with gradient statistics after skip_first={skip}: need >= 10"
        )
    k_iters = interval_iterations(paths, cfg.iterations)
    rng = np.random.default_rng(int(cfg.seed))
    fit = fit_spread(real, base, k_iters, rng)
    fit.update(held_out(real, base, folds))
    fitted = ConvergenceModel(replace(model.params, **{f: fit[f] for f in GRAD_SPREAD_FIELDS}))
    sim = intervals(tl, "sim", skip) if (tl.backend == "sim").any() else real.iloc[:0]
    first_real = every_real[every_real.k == 0]
    fit.update({
        "workload": name, "base_batch": base, "iterations_per_interval": k_iters, "skip_first": skip,
        "intervals": len(real), "runs": int(real.groupby(["controller", "seed"]).ngroups),
        "timelines": [str(p) for p in cfg.timelines], "command": COMMAND + overrides_text(),
        "first_interval_median_cv": float(first_real.cv.median()) if len(first_real) else float("nan"),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip
    text = report(fit, by_batch(real, sim, fitted, fit))  # everything computed before anything is written
    before = write_model(out, name, {f: fit[f] for f in GRAD_SPREAD_FIELDS})
    fit["before"] = {f: before.get(f) for f in GRAD_SPREAD_FIELDS}
    atomic_write_text(out / "grad_spread.json", dump_json(fit))
    atomic_write_text(out / "grad_spread.md", text)
    doc = json.loads((out / PROFILE_FILE).read_text())
    doc.setdefault("provenance", {}).setdefault("refits", []).append(
        {
            "command": fit["command"],
            "what": "gradient spread fitted to real timelines",
            "created_utc": fit["created_utc"],
        }
    )
    atomic_write_text(out / PROFILE_FILE, dump_json(doc))
    load_profile(out)  # the rewritten profile loads (checked)
    log.info(
        "%s: grad_norm_cv %.3f x (b / %d) ** %.3f (held-out RMSE of log cv %.3f; constant spread %.3f); wrote %s",
        name, fit["grad_norm_cv"], base, fit["grad_norm_cv_exponent"], fit["rmse_log_cv_power_law"],
        fit["rmse_log_cv_constant"], out / "grad_spread.md",
    )  # fmt: skip
    return fit


def report(fit: dict[str, Any], rows: list[list[str]]) -> str:
    return "\n".join(
        [
            f"# Gradient spread of {fit['workload']} fitted to real ranks",
            "",
            f"Regenerate: `{fit['command']}` ({fit['created_utc']}).",
            "",
            f"{fit['intervals']} real intervals of K = {fit['iterations_per_interval']} iterations ({fit['runs']} runs; "
            f"each run's first {fit['skip_first']} left out): the coefficient of variation of a rank's gradient norm over "
            f"the interval's iterations is **{fit['grad_norm_cv']:.3f} x (b / {fit['base_batch']}) ^ "
            f"{fit['grad_norm_cv_exponent']:.3f}** (exponent s.e. {fit['exponent_stderr']:.3f}; R^2 {fit['r2']:.2f}) at local "
            f"batch b; the measured level {fit['measured_level']:.3f} is the K-sample estimate, {fit['estimator_bias']:.3f} "
            "of the spread it estimates. RMSE of log cv: "
            f"{fit['rmse_log_cv']:.3f} in sample; on held-out seeds {fit['rmse_log_cv_power_law']:.3f} "
            f"(a spread that does not depend on the batch: {fit['rmse_log_cv_constant']:.3f}).",
            "",
            *table(["local batch", "intervals", "measured median cv", "fitted", "simulated before"], rows),
            "",
            f"Not modelled: a run's first interval, from initialisation (measured median cv "
            f"{fit['first_interval_median_cv']:.3f}), where the norm falls within the interval while the "
            "simulator holds the gradient statistics of an interval fixed.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
