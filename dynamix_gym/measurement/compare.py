"""Comparing a calibrated simulator with the backend it was fitted to: predicted iteration times,
time-to-accuracy tables, Kendall's tau of controller orderings and PPO's advantage."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from sim.engine import Simulator
from sim.faults import Scenario
from sim.profile import ClusterProfile

# --------------------------------------------------------------------------------------------
# Comparing a calibrated simulator with the real backend
# --------------------------------------------------------------------------------------------

#: Speed-changing windows the iteration-time check follows (the others do not change step times).
SPEED_WINDOWS = ("throttle", "slowdown")


def speeds_at(scenario: Scenario, n: int, t_s: float) -> tuple[float, ...]:
    """Per-worker speed multipliers at scenario time ``t_s`` (static speeds x active throttles)."""
    speed = np.asarray(scenario.worker_speed or (1.0,) * n, dtype=np.float64).copy()
    for w in scenario.windows:
        if w.kind in SPEED_WINDOWS and w.start_s <= t_s < w.start_s + w.duration_s:
            speed[w.worker] *= w.factor
    return tuple(float(x) for x in speed)


class IterationPredictor:
    """Noise-free iteration / compute times of the calibrated simulator at given speeds."""

    def __init__(self, profile: ClusterProfile) -> None:
        self.profile = profile
        self._sims: dict[tuple[float, ...], Simulator] = {}

    def _sim(self, speeds: tuple[float, ...]) -> Simulator:
        if speeds not in self._sims:
            sc = Scenario(name="speeds", worker_speed=speeds, compute_noise_cv=0.0, measurement_noise_cv=0.0)
            s = Simulator(profile=self.profile, scenario=sc)
            s.reset(seed=0)
            self._sims[speeds] = s
        return self._sims[speeds]

    def iteration_time_s(self, batches: np.ndarray, speeds: tuple[float, ...]) -> float:
        return self._sim(speeds).iteration_time_s(np.asarray(batches, dtype=np.float64))

    def compute_time_s(self, batches: np.ndarray, speeds: tuple[float, ...]) -> np.ndarray:
        return self._sim(speeds).compute_time_s(np.asarray(batches, dtype=np.float64))


def tta_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per controller and backend: mean and median time to accuracy (a run that missed the target
    counts as its truncation time, and is flagged), its spread and runs; over the runs that reached
    the target, the steps they took and the seconds per step (a ratio sim / real of each splits a
    time-to-accuracy error into convergence and speed); decision time."""
    out = []
    for (ctrl, backend), g in runs.groupby(["controller", "backend"], sort=False):
        t = np.where(g["reached"], g["tta_s"], g["total_time_s"])
        ok = g[g["reached"]]
        out.append(
            {
                "controller": ctrl,
                "backend": backend,
                "tta_mean_s": float(np.mean(t)),
                "tta_median_s": float(np.median(t)),
                "tta_sd_s": float(np.std(t, ddof=1)) if len(t) > 1 else math.nan,
                "runs": len(t),
                "reached": int(g["reached"].sum()),
                "tta_runs_s": [round(float(x), 3) for x in t],
                "steps_mean": float(ok["steps"].mean()) if len(ok) else math.nan,
                "s_per_step": float((ok["tta_s"] / ok["steps"]).mean()) if len(ok) else math.nan,
                "decision_time_ms": float(g["decision_time_ms"].mean()),
                "decisions": float(g["decisions"].mean()),
            }
        )
    return pd.DataFrame(out)


def ranking(
    table: pd.DataFrame, runs: pd.DataFrame, labels: Sequence[str], seed: int, stat: str = "mean"
) -> dict[str, Any]:
    """Kendall's tau-b between the real and the simulated orderings of time to accuracy (the
    ``stat``, mean or median, over seeds), and a percentile bootstrap interval of it over the real
    runs (each controller's real runs resampled, the simulated statistic held)."""
    col = f"tta_{stat}_s"
    reduce = {"mean": np.mean, "median": np.median}[stat]
    real = table[table.backend == "real"].set_index("controller").loc[list(labels)]
    simt = table[table.backend == "sim"].set_index("controller").loc[list(labels)]
    res = stats.kendalltau(real[col], simt[col])
    groups = dict(list(runs[runs.backend == "real"].groupby("controller", sort=False)))
    samples = [
        np.asarray(
            np.where(groups[c]["reached"], groups[c]["tta_s"], groups[c]["total_time_s"]), dtype=np.float64
        )
        for c in labels
    ]
    sim_stat = simt[col].to_numpy()
    ci = (math.nan, math.nan)
    if all(len(x) > 1 for x in samples):

        def tau_of(*xs: np.ndarray) -> float:
            return float(stats.kendalltau([reduce(x) for x in xs], sim_stat).statistic)

        boot = stats.bootstrap(
            samples,
            tau_of,
            vectorized=False,
            paired=False,
            n_resamples=999,
            method="percentile",
            random_state=np.random.default_rng(seed),
        )
        ci = (float(boot.confidence_interval.low), float(boot.confidence_interval.high))
    return {
        "statistic": stat,
        "kendall_tau": float(res.statistic),
        "kendall_p": float(res.pvalue),
        "kendall_tau_ci95": list(ci),
        "order_real": list(real[col].sort_values().index),
        "order_sim": list(simt[col].sort_values().index),
    }


def ppo_advantage(
    table: pd.DataFrame, static_labels: Sequence[str], stat: str = "mean"
) -> dict[str, Any] | None:
    """PPO's advantage over the best static batch, as a percentage of the best static time to
    accuracy (the ``stat`` over seeds), in each backend, and the gap between the two in points."""
    if "ppo" not in set(table.controller):
        return None
    col = f"tta_{stat}_s"
    out: dict[str, Any] = {"statistic": stat}
    for backend in ("sim", "real"):
        t = table[table.backend == backend].set_index("controller")[col]
        best = t.loc[list(static_labels)].idxmin()
        out[backend] = {
            "best_static": best,
            "best_static_tta_s": float(t[best]),
            "ppo_tta_s": float(t["ppo"]),
            "advantage_pct": 100.0 * (float(t[best]) - float(t["ppo"])) / float(t[best]),
        }
    out["gap_points"] = abs(out["sim"]["advantage_pct"] - out["real"]["advantage_pct"])
    return out
