"""Fits the simulator's instability term (:mod:`sim.instability`) to a real jump campaign.

    python -m experiments.jump_campaign task=cnn_digits && python -m experiments.fit_instability task=cnn_digits

``P(collapse) = sigmoid(intercept + slope * log2(g) + ramp_effect * [ramped])`` by maximum
likelihood (scikit-learn's unpenalised logistic regression) over the campaign's runs, with ``g`` the
learning-rate multiplier the jump reached (its largest rate after the jump over the rate before,
which is the base rate) and ``ramped`` the guards' ramp on; ``depth`` the median share of the quality
above chance that a collapse lost (1 for a non-finite loss). The report puts the predicted rate of
every cell (rule, ramp, point, jump) beside the measured one with its 95% Clopper-Pearson interval,
and the log loss on held-out seeds (folds of seeds) against a constant rate.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig
from scipy.stats import binomtest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss

from experiments.common import atomic_write_text
from experiments.reports.markdown import table
from sim.datafiles import dump_json
from sim.instability import INSTABILITY_FILE, InstabilityParams, instability_doc

log = logging.getLogger(__name__)


def features(runs: pd.DataFrame) -> np.ndarray:
    gain = np.maximum(runs.lr_after / runs.lr_before, 1.0)
    return np.column_stack([np.log2(gain), (runs.ramp > 0).astype(float)])


def fit(runs: pd.DataFrame) -> LogisticRegression:
    return LogisticRegression(C=np.inf, max_iter=1000).fit(features(runs), runs.collapsed.astype(int))


def held_out_log_loss(runs: pd.DataFrame, folds: int) -> tuple[float, float]:
    """(model, constant rate) log loss over folds of seeds, each predicted by a fit without it."""
    seeds = np.sort(runs.seed.unique())
    model_p, const_p, ys = [], [], []
    for part in np.array_split(seeds, folds):
        test, train = runs[runs.seed.isin(part)], runs[~runs.seed.isin(part)]
        y = train.collapsed.astype(int)
        if y.nunique() < 2:
            continue
        model_p.append(fit(train).predict_proba(features(test))[:, 1])
        const_p.append(np.full(len(test), y.mean()))
        ys.append(test.collapsed.astype(int).to_numpy())
    y = np.concatenate(ys)
    return float(log_loss(y, np.concatenate(model_p), labels=[0, 1])), float(
        log_loss(y, np.concatenate(const_p), labels=[0, 1])
    )


def _drop(runs: pd.DataFrame) -> str:
    """The campaign's collapse threshold, as its runs recorded it (0.3 before they did)."""
    drops = runs["collapse_drop"].dropna().unique() if "collapse_drop" in runs else []
    return "/".join(f"{d:g}" for d in sorted(drops)) or "0.3"


def report(
    runs: pd.DataFrame, params: InstabilityParams, model: LogisticRegression, cv: tuple[float, float], cfg
) -> str:
    runs = runs.assign(predicted=model.predict_proba(features(runs))[:, 1])
    lines = [
        f"# Instability: real collapses after a jump of the learning rate ({cfg.task})",
        "",
        f"Regenerate: `python -m experiments.jump_campaign task={cfg.task}` then "
        f"`python -m experiments.fit_instability task={cfg.task}`. {len(runs)} real runs on 2 CPU ranks "
        f"(seeds {sorted(runs.seed.unique().tolist())}): train at the base batch, then jump the global batch x2/x4/x8 "
        "early or late, by rule, with the guards' ramp (20 iterations) or without; the watchdog out of reach. A "
        f"collapse: quality {_drop(runs)} below its value before the jump, or a non-finite loss.",
        "",
        "Fitted (`sim.instability`, written to `instability.json`):",
        "",
        f"    P(collapse) = sigmoid({params.intercept:.3f} + {params.slope:.3f} log2(g) "
        f"{params.ramp_effect:+.3f} [ramped]);  depth {params.depth:.3f}",
        "",
        f"Held-out log loss (folds of seeds): model {cv[0]:.3f}, constant rate {cv[1]:.3f}.",
        "",
    ]
    header = ["rule", "ramp", "point", "jump", "g (median)", "runs", "collapses", "measured [95% CI]"]
    return "\n".join(lines + table([*header, "predicted", "diverged"], _cells(runs))) + "\n"


def _cells(runs: pd.DataFrame) -> list[list[Any]]:
    """One row per campaign cell: the measured collapse rate with its exact interval, the predicted."""
    out = []
    for (rule, ramp, point, jump), g in runs.groupby(["rule", "ramp", "point", "jump"]):
        k, n = int(g.collapsed.sum()), len(g)
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        gain = float(np.median(g.lr_after / g.lr_before))
        measured = f"{k / n:.2f} [{ci.low:.2f}, {ci.high:.2f}]"
        out.append([rule, ramp, point, jump, f"{gain:.2f}", n, k, measured, f"{g.predicted.mean():.2f}"])
        out[-1].append(int(g.diverged.sum()))
    return out


@hydra.main(version_base=None, config_path="../conf", config_name="fit_instability")
def main(cfg: DictConfig) -> None:
    folder = Path(hydra.utils.to_absolute_path(str(cfg.runs_dir)))
    runs = pd.read_csv(folder / "runs.csv")
    runs = runs[np.isfinite(runs.lr_after) & np.isfinite(runs.lr_before)]
    model = fit(runs)
    collapsed = runs[runs.collapsed]
    above = np.maximum(collapsed.quality_before - float(cfg.chance), 1e-9)
    share = np.where(collapsed.diverged, 1.0, np.clip(collapsed.depth / above, 0.0, 1.0))
    depth = float(np.median(share)) if len(share) else 1.0
    params = InstabilityParams(
        name=str(cfg.task),
        intercept=float(model.intercept_[0]),
        slope=max(float(model.coef_[0, 0]), 0.0),
        ramp_effect=float(model.coef_[0, 1]),
        depth=min(max(depth, 1e-6), 1.0),
    )
    cv = held_out_log_loss(runs, int(cfg.cv_folds))
    doc = instability_doc(params, runs=len(runs), collapses=int(runs.collapsed.sum()),
                          held_out_log_loss={"model": cv[0], "constant_rate": cv[1]})  # fmt: skip
    atomic_write_text(folder / INSTABILITY_FILE, dump_json(doc))
    text = report(runs, params, model, cv, cfg)
    atomic_write_text(folder / "README.md", text)
    print(text)
    log.info("wrote %s (slope %.3f, ramp %.3f, depth %.3f)", folder / INSTABILITY_FILE, params.slope,
             params.ramp_effect, params.depth)  # fmt: skip
    if not math.isfinite(params.intercept):
        raise ValueError("the fit did not converge")


if __name__ == "__main__":
    main()
