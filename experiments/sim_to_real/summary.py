"""The fidelity app's ``summary.json``: what was measured under which conditions, the iteration-time
checks, time to accuracy per controller, the ranking and PPO's advantage, against the targets."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from experiments.common import plain, shown
from sim.faults import Scenario
from sim.profile import ClusterProfile


def loadavg_summary(cond: dict[str, Any], prov: dict[str, Any]) -> dict[str, Any]:
    loads = cond["loads"]
    return {
        "start": cond["load_start"],
        "end": cond["load_end"],
        "median": float(np.median(loads)),
        "max": float(np.max(loads)),
        "samples": [round(x, 2) for x in loads],
        "calibration": [prov.get("loadavg_start"), prov.get("loadavg_end")],
        "quiet_wait": cond["quiet"],
        "note": load_note(cond["quiet"]),
    }


def load_note(quiet: dict[str, Any] | None) -> str:
    if quiet is None:
        return "no wait for a quiet machine was requested (quiet.enabled=false)"
    if quiet["quiet"]:
        return f"measured after the machine had been quiet (load < threshold) for a minute; waited {quiet['waited_s']:.0f} s"
    return f"the machine did not get quiet within {quiet['waited_s']:.0f} s; measured anyway"


def iteration_summary(
    holdout: dict[str, Any], speed: dict[str, Any] | None, intervals: pd.DataFrame
) -> dict[str, Any]:
    return {
        "mdape_by_type": dict(holdout["mdape"]),
        "holdout": {k: v for k, v in holdout.items() if k not in ("rows", "fit")},
        "speed_ladder": {k: v for k, v in speed.items() if k != "rows"} if speed else None,
        "controller_intervals": {
            "n": len(intervals),
            "mdape": float(intervals["ape"].median()),
            "mdape_by_controller": intervals.groupby("controller")["ape"].median().to_dict(),
            "median_bias": float(np.median(intervals["predicted_s"] / intervals["measured_s"]) - 1),
        },
    }


def tta_summary(tta: pd.DataFrame, labels: Sequence[str]) -> dict[str, Any]:
    """Per controller: mean and median time to accuracy in both backends, the ratios sim / real
    (time, steps, seconds per step) and how many runs reached the target."""
    by = tta.set_index(["controller", "backend"])

    def one(lab: str) -> dict[str, Any]:
        r, m = by.loc[(lab, "real")], by.loc[(lab, "sim")]
        return {
            "real_s": float(r["tta_mean_s"]),
            "sim_s": float(m["tta_mean_s"]),
            "ratio_sim_over_real": float(m["tta_mean_s"] / r["tta_mean_s"]),
            "real_median_s": float(r["tta_median_s"]),
            "sim_median_s": float(m["tta_median_s"]),
            "steps_ratio_sim_over_real": float(m["steps_mean"] / r["steps_mean"]),
            "s_per_step_ratio_sim_over_real": float(m["s_per_step"] / r["s_per_step"]),
            "reached_real": f"{int(r['reached'])}/{int(r['runs'])}",
            "reached_sim": f"{int(m['reached'])}/{int(m['runs'])}",
        }

    return {lab: one(lab) for lab in labels}


def setup_summary(
    cfg: DictConfig, profile: ClusterProfile, real_config: dict[str, Any], scenario: Scenario, interval: int
) -> dict[str, Any]:
    n = int(real_config["workers"])
    return {
        "real": f"{n} CPU ranks (gloo), {real_config['model']} on {real_config['dataset']}, base lr "
        f"{real_config.get('base_lr')} ({real_config.get('lr_rule')}), local batches "
        f"[{real_config.get('min_batch')}, {real_config.get('max_batch')}]",
        "workers": n,
        "profile": shown(profile.path),
        "profile_summary": profile_summary(profile),
        "scenario": {
            "name": scenario.name,
            "description": scenario.description,
            "worker_speed": list(scenario.worker_speed),
            "windows": [w.__dict__ for w in scenario.windows],
            "compute_noise_cv": scenario.compute_noise_cv,
        },
        "interval": interval,
        "initial_batch": int(cfg.initial_batch),
        "time_budget_s": float(cfg.time_budget_s),
        "target_accuracy": profile.workload.target_quality,
        "metric": profile.workload.metric.name,
        "target_metric": float(profile.workload.target_accuracy),  # in the metric's own units
        "real_seeds": list(cfg.real_seeds),
        "sim_seeds": list(cfg.sim_seeds),
    }


def profile_summary(profile: ClusterProfile) -> str:
    c = next(iter(profile.compute.values()))
    m = next(iter(profile.comm.values()))
    cal = profile.meta.get("calibration") or {}
    conv = cal.get("convergence") or {}
    sim_s = profile.simulator
    parts = [
        f"compute {c.gpu}: alpha {1e3 * c.alpha_s:.2f} ms + {1e3 * c.beta_s:.3f} ms/sample^{c.exponent:.2f}, "
        f"host floor {1e3 * c.host_s:.2f} ms",
        f"all-reduce {1e3 * m.alpha_intra_s:.2f} ms (gamma {m.gamma:.2f})",
        f"interval overhead {1e3 * sim_s.get('interval_overhead_s', 0):.1f} ms, reconfiguration "
        f"{1e3 * sim_s.get('reconfig_delay_s', 0):.1f} ms",
    ]
    if conv:
        parts.append(
            f"convergence fit RMSE {100 * conv['rmse_raw']:.1f} accuracy points over the measured curves"
        )
    return "; ".join(parts)


def ppo_batches(timelines: pd.DataFrame, best_static_batch: int, workers: int) -> dict[str, float]:
    """PPO's mean global batch in each backend beside the best static controller's global batch."""
    pt = timelines[timelines.controller == "ppo"]
    return {
        "real": float(pt[pt.backend == "real"]["global_batch"].mean()),
        "sim": float(pt[pt.backend == "sim"]["global_batch"].mean()),
        "best_static": float(best_static_batch * workers),
    }


def targets_met(s: dict[str, Any]) -> dict[str, Any]:
    tg, ppo = s["targets"], s["ppo"]
    return {
        "iteration_time_mdape": all(
            v <= tg["iteration_time_mdape"] for v in s["iteration_time_mdape"].values()
        ),
        "kendall_tau": s["ranking"]["kendall_tau"] >= tg["kendall_tau"],
        "ppo_gap_points": None if ppo is None else ppo["gap_points"] <= tg["ppo_gap_points"],
    }


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def machine() -> str:
    return f"{os.cpu_count()} CPU cores, no GPU"


def targets(cfg: DictConfig) -> dict[str, Any]:
    return plain(cfg.targets)
