"""Sim-to-real fidelity of a calibrated cluster profile: how well the calibrated simulator predicts
real training and ranks controllers.

    python -m experiments.calibrate out_dir=results/fidelity/profile
    python -m experiments.train experiment=train_profile run_dir=runs/profile   # PPO for this profile
    python -m experiments.fidelity

Three checks, all against the real DDP backend the profile was measured on:

1. Iteration time. (a) Fit the profile's step-time models on part of its measured batch ladder and
   predict the held-out batches (MdAPE per worker type); (b) predict, with no fitting at all, the
   step times of the real ranks run at the scenario's static worker speeds; (c) predict every
   interval the controllers ran on the real backend from its local batches and fault state.
2. Time to accuracy. One fault scenario, every controller (static batches, DLB, REX, a PPO
   policy pretrained on this profile, the headline bundle pretrained on CIFAR-10 clusters) on the
   real backend and in the calibrated simulator: per-controller time-to-accuracy ratio sim / real,
   Kendall's tau between the two orderings (with a bootstrap interval over the real seeds), and
   PPO's advantage over the best static batch in both.
3. Plots: predicted vs measured iteration times, sim vs real accuracy curves, time to accuracy.

Writes ``report.md`` (the commands that regenerate it at its top), ``summary.json``, ``runs.csv``,
``timelines.csv`` and the PNGs into ``out_dir``. Returns Kendall's tau.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig
from tqdm.auto import tqdm

from dynamix_gym.controllers.bundle import PPOController
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.measurement.compare import IterationPredictor, ppo_advantage, ranking, speeds_at, tta_table
from dynamix_gym.measurement.profiling import profile_ladder, wait_for_quiet
from experiments.common import atomic_write_text, plain, shown
from experiments.evaluate import controller_label
from sim.faults import FaultWindow, Scenario
from sim.fitting.step_time import holdout_errors
from sim.fitting.table import read_profile_table
from sim.profile import MEASUREMENTS_FILE, ClusterProfile, dump_json, load_profile

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.fidelity"
# --------------------------------------------------------------------------------------------
# Setup: scenario, controllers, envs
# --------------------------------------------------------------------------------------------


def build_scenario(cfg: DictConfig, profile: ClusterProfile) -> Scenario:
    s = plain(cfg.scenario)
    cv = s.get("compute_noise_cv")
    if cv is None:
        cv = (profile.meta.get("measured") or {}).get("compute_noise_cv") or 0.03
    return Scenario(
        name=str(s.get("name", "fidelity")),
        description=str(s.get("description", "")),
        worker_speed=tuple(float(x) for x in s.get("worker_speed") or ()),
        windows=tuple(FaultWindow(**w) for w in s.get("windows") or ()),
        compute_noise_cv=float(min(max(cv, 0.0), 1.0)),
    )


def resolve_ppo(cfg: DictConfig) -> tuple[str | None, str]:
    """The PPO bundle to use and a sentence saying which one it is."""
    main = Path(to_absolute_path(str(cfg.ppo.path)))
    if (main / "bundle.json").is_file():
        return str(main), f"the pretrained bundle {shown(main)}"
    found = [Path(p) for p in cfg.ppo.fallbacks or [] if (Path(p) / "bundle.json").is_file()]
    if found:
        newest = max(found, key=lambda p: (p / "bundle.json").stat().st_mtime)
        return str(newest), (
            f"{shown(main)} did not exist when this report was made; the newest interim bundle, {newest} "
            "(an in-progress training run's best checkpoint), stands in for it"
        )
    return None, f"no PPO bundle ({shown(main)} and the fallbacks are absent): PPO left out"


def controller_specs(cfg: DictConfig, ppo_path: str | None) -> list[dict[str, Any]]:
    specs = []
    for c in plain(cfg.controllers):
        name, kwargs = str(c["name"]), dict(c.get("kwargs") or {})
        if name == "ppo":
            if ppo_path is None:
                continue
            kwargs = {"path": ppo_path, **kwargs}
        ctrl = build_controller(name, kwargs)
        label = str(c.get("label") or controller_label(ctrl))
        ib = int(kwargs["batch"]) if name == "static" else int(cfg.initial_batch)
        specs.append(
            {"label": label, "name": name, "kwargs": kwargs, "initial_batch": ib, "static": name == "static"}
        )
    return specs


def build_controller(name: str, kwargs: dict[str, Any]) -> Any:
    return PPOController(**kwargs) if name == "ppo" else make_controller(name, **kwargs)


class RealEnvs:
    """Real DDP backends for the scenario, one per initial batch, kept alive across episodes."""

    def __init__(self, real_config: dict[str, Any], scenario: Scenario, budget_s: float) -> None:
        self.base = {**real_config, "scenario": scenario, "fault_time_scale": 1.0, "time_budget_s": budget_s}
        self.backends: dict[int, Any] = {}

    def env(self, initial_batch: int, action_mode: str, interval: int, reward: str) -> HeteroClusterEnv:
        from adapters.config import RealDDPConfig
        from adapters.ddp_backend import DDPBackend

        if initial_batch not in self.backends:
            self.backends[initial_batch] = DDPBackend(
                RealDDPConfig(**{**self.base, "initial_batch": initial_batch})
            )
        be = self.backends[initial_batch]
        return HeteroClusterEnv(backend=be, action_mode=action_mode, interval=interval, reward=reward)

    def close(self) -> None:
        for be in self.backends.values():
            be.close()


def sim_env(
    profile: ClusterProfile,
    scenario: Scenario,
    initial_batch: int,
    action_mode: str,
    interval: int,
    reward: str,
    budget_s: float,
) -> HeteroClusterEnv:
    return HeteroClusterEnv(
        profile=profile,
        scenario=scenario,
        initial_batch=initial_batch,
        action_mode=action_mode,
        interval=interval,
        reward=reward,
        time_budget_s=budget_s,
    )


def run_one(
    env: HeteroClusterEnv, spec: dict[str, Any], seed: int, backend: str, scenario: str
) -> dict[str, Any]:
    ctrl = build_controller(spec["name"], spec["kwargs"])
    res = run_episode(env, ctrl, seed, scenario=scenario)
    s = res.summary
    timeline = pd.DataFrame(res.timeline)
    timeline.insert(0, "seed", seed)
    timeline.insert(0, "backend", backend)
    timeline.insert(0, "controller", spec["label"])
    return {
        "controller": spec["label"],
        "backend": backend,
        "seed": seed,
        "reached": bool(s["reached_target"]),
        "tta_s": float(s["time_to_accuracy_s"]) if s["reached_target"] else math.nan,
        "total_time_s": float(s["total_time_s"]),
        "final_accuracy": float(s["final_accuracy"]),
        "decisions": int(s["decisions"]),
        "steps": (int(s["decisions"]) + 1) * int(env.unwrapped.interval),
        "decision_time_ms": float(s["decision_time_ms"]),
        "mean_idle_fraction": float(s["mean_idle_fraction"]),
        "batch_changes": int(s["batch_changes"]),
        "timeline": timeline,
    }


# --------------------------------------------------------------------------------------------
# Iteration-time checks
# --------------------------------------------------------------------------------------------


def speed_ladder(
    cfg: DictConfig, profile: ClusterProfile, real_config: dict[str, Any], scenario: Scenario
) -> dict[str, Any]:
    """Real step times at the scenario's static speeds vs the simulator's prediction (no fitting)."""
    from adapters.config import RealDDPConfig
    from adapters.ddp_backend import DDPBackend

    n = int(real_config["workers"])
    speeds = tuple(scenario.worker_speed or (1.0,) * n)
    static = Scenario(name="static_speeds", worker_speed=speeds)
    be = DDPBackend(
        RealDDPConfig(**{**real_config, "scenario": static, "fault_time_scale": 1.0, "target_accuracy": 1.0})
    )
    sl = cfg.speed_ladder
    try:
        res = profile_ladder(
            {n: be},
            list(sl.batches),
            iterations=int(sl.iterations),
            repeats=int(sl.repeats),
            budget_s=float(sl.budget_s),
            progress=bool(cfg.progress),
        )
    finally:
        be.close()
    pred = IterationPredictor(profile)
    rows = []
    for p in res.points:
        b = np.full(n, p["local_batch"])
        comp_pred = pred.compute_time_s(b, speeds)
        row = {
            "local_batch": int(p["local_batch"]),
            "measured_s": p["step_time_s"],
            "predicted_s": pred.iteration_time_s(b, speeds),
        }
        for i in range(n):
            row[f"w{i}_compute_measured_s"] = p["compute_time_s"][i]
            row[f"w{i}_compute_predicted_s"] = float(comp_pred[i])
        row["ape"] = abs(row["predicted_s"] / row["measured_s"] - 1.0)
        rows.append(row)
    comp = {}
    for i in range(n):
        ape = [abs(r[f"w{i}_compute_predicted_s"] / r[f"w{i}_compute_measured_s"] - 1) for r in rows]
        comp[f"worker {i} (speed {speeds[i]:g})"] = float(np.median(ape)) if ape else math.nan
    return {
        "speeds": list(speeds),
        "rows": rows,
        "mdape": float(np.median([r["ape"] for r in rows])) if rows else math.nan,
        "compute_mdape_by_worker": comp,
        "message": res.message(),
    }


def interval_errors(
    timelines: pd.DataFrame, profile: ClusterProfile, scenario: Scenario, n: int
) -> pd.DataFrame:
    """Every real interval's mean iteration time vs the simulator's at its batches and speeds."""
    pred = IterationPredictor(profile)
    rows = []
    for r in timelines.itertuples(index=False):
        d = r._asdict()
        b = np.array([d[f"w{i}_batch"] for i in range(n)], dtype=np.float64)
        measured = float(np.mean([d[f"w{i}_iteration_time_s"] for i in range(n)]))
        start = max(float(d["wall_time_s"]) - float(d["interval_time_s"]), 0.0)
        speeds = speeds_at(scenario, n, start)
        p = pred.iteration_time_s(b, speeds)
        rows.append(
            {
                "controller": d["controller"],
                "seed": d["seed"],
                "step": d["step"],
                "start_s": start,
                "speeds": speeds,
                "batches": tuple(int(x) for x in b),
                "measured_s": measured,
                "predicted_s": p,
                "ape": abs(p / measured - 1.0),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------


def plot_iteration_times(
    path: Path,
    holdout: dict[str, Any],
    table: pd.DataFrame,
    speed: dict[str, Any] | None,
    intervals: pd.DataFrame,
    mdape: dict[str, float],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.fitting.step_time import step_time_s

    fig, ax = plt.subplots(figsize=(7.2, 6.4))
    if len(intervals):
        ax.scatter(
            intervals["measured_s"],
            intervals["predicted_s"],
            s=7,
            alpha=0.25,
            color="0.45",
            label=f"real controller intervals (MdAPE {100 * intervals['ape'].median():.1f} %)",
        )
    held = {(r["workers"], r["local_batch"]) for r in holdout["rows"]}
    fitted = holdout["fit"]
    markers = {1: "o", 2: "s", 3: "^", 4: "D"}
    for w, g in table.groupby("num_gpus"):
        fit_rows = g[[(w, b) not in held for b in g["local_batch"]]]
        gpu = str(g["gpu"].iloc[0])
        c = next(p for p in fitted["compute"] if p.gpu == gpu)
        m = next((p for p in fitted["comm"] if p.gpu == gpu), None)
        pred = step_time_s(c, m, fit_rows["local_batch"].to_numpy(np.float64), int(w))
        ax.scatter(
            fit_rows["step_time_s"],
            pred,
            marker=markers.get(int(w), "o"),
            facecolors="none",
            edgecolors="tab:blue",
            s=36,
            label=f"{w} worker(s): ladder batches fitted",
        )
        hr = [r for r in holdout["rows"] if r["workers"] == w]
        ax.scatter(
            [r["measured_s"] for r in hr],
            [r["predicted_s"] for r in hr],
            marker=markers.get(int(w), "o"),
            color="tab:red",
            s=40,
            label=f"{w} worker(s): held-out batches",
        )
    if speed and speed["rows"]:
        ax.scatter(
            [r["measured_s"] for r in speed["rows"]],
            [r["predicted_s"] for r in speed["rows"]],
            marker="*",
            s=110,
            color="tab:green",
            label=f"speeds {speed['speeds']}: predicted, not fitted (MdAPE {100 * speed['mdape']:.1f} %)",
        )
    pts = (
        [r["measured_s"] for r in holdout["rows"]]
        + list(table["step_time_s"])
        + list(intervals.get("measured_s", []))
    )
    lo, hi = 0.7 * min(pts), 1.4 * max(pts)
    x = np.geomspace(lo, hi, 50)
    ax.plot(x, x, "k-", lw=1)
    ax.plot(x, 1.1 * x, "k:", lw=0.8, label="+-10 %")
    ax.plot(x, x / 1.1, "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (s), real DDP ranks")
    ax.set_ylabel("predicted iteration time (s), calibrated simulator")
    ax.set_title(
        "Iteration time: held-out MdAPE " + ", ".join(f"{g} {100 * v:.1f} %" for g, v in mdape.items())
    )
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_accuracy(
    path: Path, timelines: pd.DataFrame, labels: Sequence[str], target: float, sim_show: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.5 * cols, 2.9 * rows), sharey=True, squeeze=False)
    for ax, label in zip(axes.flat, labels, strict=False):
        t = timelines[timelines.controller == label]
        sims = [g for i, (_, g) in enumerate(t[t.backend == "sim"].groupby("seed")) if i < sim_show]
        reals = [g for _, g in t[t.backend == "real"].groupby("seed")]
        for i, g in enumerate(sims):
            ax.plot(
                g["wall_time_s"],
                g["val_accuracy"],
                color="tab:blue",
                lw=1.0,
                alpha=0.7,
                label="simulated" if i == 0 else None,
            )
        ends = [float(g["wall_time_s"].iloc[-1]) for g in sims]
        cut = 0
        for i, g in enumerate(reals):
            reached = bool(g["val_accuracy"].iloc[-1] >= target)
            ax.plot(
                g["wall_time_s"],
                g["val_accuracy"],
                color="tab:red",
                lw=1.2,
                alpha=0.8,
                label="real" if i == 0 else None,
            )
            if reached:
                ends.append(float(g["wall_time_s"].iloc[-1]))
            else:
                cut += 1
        ax.axhline(target, color="k", lw=0.7, ls=":")
        ax.set_xlim(0, 1.15 * max(ends) if ends else None)
        ax.set_title(label + (f" ({cut} real run missed the target; cut)" if cut else ""), fontsize=8)
        ax.grid(True, alpha=0.2)
    for ax in axes.flat[len(labels) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("validation accuracy")
    for ax in axes[-1, :]:
        ax.set_xlabel("wall time (s)")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Validation accuracy over time: real (red, every seed) vs calibrated simulator (blue, {sim_show} seeds); "
        f"dotted: target {target}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_tta(
    path: Path, table: pd.DataFrame, runs: pd.DataFrame, labels: Sequence[str], rank: dict[str, Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    real = table[table.backend == "real"].set_index("controller").loc[list(labels)]
    simt = table[table.backend == "sim"].set_index("controller").loc[list(labels)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12.5, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    x = np.arange(len(labels))
    a1.bar(x - 0.2, real["tta_mean_s"], 0.4, color="tab:red", alpha=0.55, label="real (mean; dots: runs)")
    a1.bar(
        x + 0.2, simt["tta_mean_s"], 0.4, color="tab:blue", alpha=0.55, label="simulated (mean; dots: runs)"
    )
    for i, lab in enumerate(labels):
        for backend, dx, color in (("real", -0.2, "tab:red"), ("sim", 0.2, "tab:blue")):
            g = runs[(runs.controller == lab) & (runs.backend == backend)]
            t = np.where(g["reached"], g["tta_s"], g["total_time_s"])
            a1.scatter(
                np.full(len(t), i + dx),
                t,
                s=10,
                color=color,
                zorder=3,
                marker="o",
                edgecolors="k",
                linewidths=0.3,
            )
            missed = int((~g["reached"].astype(bool)).sum())
            if missed:
                a1.annotate(
                    f"{missed} missed",
                    (i + dx, float(np.max(t))),
                    fontsize=7,
                    ha="center",
                    xytext=(0, 4),
                    textcoords="offset points",
                )
        ratio = float(simt.loc[lab, "tta_mean_s"] / real.loc[lab, "tta_mean_s"])
        a1.annotate(
            f"x{ratio:.2f}",
            (i, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    a1.set_yscale("log")
    a1.yaxis.set_major_formatter(ScalarFormatter())
    a1.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    a1.set_ylabel("time to accuracy (s)")
    a1.set_title("Time to accuracy per controller; above the bars: mean sim / mean real", fontsize=9, pad=18)
    a1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.9))
    a2.scatter(real["tta_mean_s"], simt["tta_mean_s"], color="k", zorder=3)
    for lab in labels:
        a2.annotate(
            lab,
            (real.loc[lab, "tta_mean_s"], simt.loc[lab, "tta_mean_s"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    both = np.concatenate([real["tta_mean_s"], simt["tta_mean_s"]])
    lim = [0.8 * both.min(), 1.25 * both.max()]
    a2.plot(lim, lim, "k-", lw=0.8)
    a2.fill_between(lim, [v / 1.15 for v in lim], [v * 1.15 for v in lim], color="0.9", label="+-15 %")
    for ax in (a2,):
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
    a2.set_xlim(lim)
    a2.set_ylim(lim)
    a2.set_xlabel("real, mean over seeds (s)")
    a2.set_ylabel("simulated, mean over seeds (s)")
    ci = rank["kendall_tau_ci95"]
    a2.set_title(
        f"Kendall tau {rank['kendall_tau']:.2f} (95 % bootstrap [{ci[0]:.2f}, {ci[1]:.2f}])", fontsize=9
    )
    a2.legend(fontsize=7, loc="upper left")
    a2.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def where_wrong(
    s: dict[str, Any],
    table: pd.DataFrame,
    intervals: pd.DataFrame,
    labels: Sequence[str],
    timelines: pd.DataFrame,
    profile: ClusterProfile,
) -> list[str]:
    """Sentences, with figures from this run, on where the calibrated simulator departs from real."""
    out = []
    tta = s["time_to_accuracy"]
    for lab in labels:
        d = tta[lab]
        if abs(d["ratio_sim_over_real"] - 1.0) > 0.15:
            out.append(
                f"Time to accuracy, {lab}: simulated {d['sim_s']:.2f} s against {d['real_s']:.2f} s measured "
                f"(x{d['ratio_sim_over_real']:.2f}; medians {d['sim_median_s']:.2f} vs {d['real_median_s']:.2f} s). "
                f"Over the runs that reached the target the simulator takes x{d['steps_ratio_sim_over_real']:.2f} "
                f"the steps at x{d['s_per_step_ratio_sim_over_real']:.2f} the seconds per step."
            )
    for c in s["collapses"]:
        out.append(
            f"Training collapse, {c['controller']} seed {c['seed']} (real): validation accuracy fell from "
            f"{c['from']:.2f} to chance ({c['to']:.2f}) at t = {c['t_s']:.1f} s, when the global batch went from "
            f"{c['batch_before']} to {c['batch_after']}, and never recovered ({c['intervals_after']} more intervals, "
            "until the time budget). The real AdaScale learning rate follows the backend's noisy noise-scale "
            "estimate and can spike after a batch jump; the simulator's follows the fitted noise scale and cannot "
            "diverge."
        )
    curves = profile.path / "curves.csv" if profile.path is not None else None
    if curves is not None and curves.is_file():
        c = pd.read_csv(curves)
        spikes = []
        for (m, seed), g in c.groupby(["global_batch", "seed"]):
            gain = np.diff(np.concatenate([[0.0], g["progress"]])) / np.diff(
                np.concatenate([[0.0], g["steps"]])
            )
            drop = -np.diff(g["val_accuracy"].to_numpy())
            for k in range(len(drop)):
                if drop[k] > 0.1:
                    spikes.append(
                        (
                            float(gain[k + 1]),
                            int(m),
                            int(seed),
                            float(g["val_accuracy"].iloc[k]),
                            float(g["val_accuracy"].iloc[k + 1]),
                        )
                    )
        if spikes:
            big = max(spikes)
            out.append(
                f"Learning-rate spikes in the calibration curves: {len(spikes)} intervals of the "
                f"{c.groupby(['global_batch', 'seed']).ngroups} static runs lost more than 10 accuracy points; the "
                f"largest AdaScale gain among them was x{big[0]:.1f} (global batch {big[1]}, seed {big[2]}: accuracy "
                f"{big[3]:.2f} -> {big[4]:.2f}). The simulator's accuracy never falls."
            )
    for lab in labels:
        real_row = table[(table.controller == lab) & (table.backend == "real")].iloc[0]
        dt = float(real_row["decision_time_ms"]) / 1e3
        per = float(real_row["tta_mean_s"]) / max(float(real_row["decisions"]) + 1.0, 1.0)
        if dt > 0.01 * per:
            out.append(
                f"Decision time, {lab}: {1e3 * dt:.1f} ms per decision on the real run, {100 * dt / per:.1f} % of an "
                "interval; the real clock counts it, the simulator's does not (it charges no controller time)."
            )
    if len(intervals):
        slowed = intervals.assign(
            throttled=[
                min(sp) < min(s["setup"]["scenario"]["worker_speed"]) - 1e-9 for sp in intervals["speeds"]
            ]
        )
        g = slowed.groupby("throttled")["ape"].median()
        if True in g.index:
            out.append(
                f"Iteration time inside the throttling window: MdAPE {100 * g[True]:.1f} % "
                f"({100 * g.get(False, math.nan):.1f} % outside it)."
            )
        worst = intervals.groupby("controller")["ape"].median().nlargest(2)
        out.append(
            f"Iteration time over the controllers' real intervals: median bias "
            f"{100 * s['iteration_time']['controller_intervals']['median_bias']:+.1f} % (predicted / measured - 1), "
            f"MdAPE {100 * intervals['ape'].median():.1f} %; largest for "
            + ", ".join(f"{c} ({100 * v:.1f} %)" for c, v in worst.items())
            + "."
        )
    conv = (profile.meta.get("calibration") or {}).get("convergence") or {}
    if conv:
        out.append(
            f"Convergence model: accuracy RMSE {100 * conv['rmse_raw']:.1f} points over every measured point of the "
            f"calibration curves ({100 * conv['rmse_binned']:.1f} on the seed-averaged binned curves); "
            + "; ".join(n for n in conv.get("notes", []) if n.startswith("time-to-target"))
            + "."
        )
    out += (profile.meta.get("calibration") or {}).get("notes", [])
    return out


def collapses(timelines: pd.DataFrame, chance: float) -> list[dict[str, Any]]:
    """Real runs whose validation accuracy fell back to chance (+5 points) for good after having
    been above it (+10 points): training that diverged."""
    out = []
    real = timelines[timelines.backend == "real"]
    for (ctrl, seed), g in real.groupby(["controller", "seed"], sort=False):
        acc = g["val_accuracy"].to_numpy()
        low = acc < chance + 0.05
        if len(acc) > 3 and low[-1] and acc.max() > chance + 0.1:
            k = int(np.flatnonzero(~low)[-1]) + 1  # first interval of the final collapse
            gb = g["global_batch"].to_numpy()
            out.append(
                {
                    "controller": ctrl,
                    "seed": int(seed),
                    "from": float(acc[:k].max()),
                    "to": float(acc[k]),
                    "t_s": float(g["wall_time_s"].iloc[k]),
                    "batch_before": int(gb[k - 1]),
                    "batch_after": int(gb[k]),
                    "intervals_after": len(acc) - k,
                }
            )
    return out


STRUCTURAL = [
    "A slowed worker: the simulator stretches `T_gpu` by `gpu_slowdown` and leaves the host floor `host_s` "
    "alone; the real adapter sleeps in proportion to the rank's forward and backward time and does not "
    "stretch its optimiser step. The CPU profile is fitted without a host floor (so that the whole fixed "
    "cost slows down, as on the real ranks); the optimiser step that the simulator does stretch is a few "
    "per cent of a step.",
    "Two CPU ranks share two cores with the coordinator, the controller and the rank-0 validation pass: "
    "contention the one-worker compute rows do not see is folded into the fitted all-reduce model, not "
    "modelled as such; with two workers the all-reduce model's per-extra-worker slope is not identified.",
    "Per-interval costs (coordination, validation on rank 0, the out-of-memory probe at a new batch) are one "
    "measured constant (`interval_overhead_s`) plus a reconfiguration delay; their spread from interval to "
    "interval is not modelled, nor is the controller's decision time.",
    "Validation accuracy in the simulator is the fitted curve plus binomial noise; real training curves "
    "differ from seed to seed by more than that (data order, initialisation), which the simulator's seeds "
    "do not reproduce. The convergence model is fitted to static-batch curves only: a schedule that moves "
    "the batch relies on its progress (AdaScale gain) and batch-memory assumptions, and its ceiling / "
    "stretch are power laws in the batch that the measured curves follow only roughly.",
    "Utilisation counters: a profile measured on CPUs counts the workers' compute as CPU time, and both "
    "backends count an emulated slow-down as busy time, so CPU and device utilisation mean the same in "
    "both; host memory is not calibrated (the simulator assumes a 3 GiB process baseline, the CPU ranks "
    "use a fraction of that). `python -m experiments.obs_gap` ranks the observation features by how much "
    "they differ between the two backends (results/fidelity/observation_gap.md): memory, then early "
    "validation accuracy (the real curve rises faster at first) lead.",
]


def report_markdown(s: dict[str, Any], table: pd.DataFrame, labels: Sequence[str]) -> str:
    it = s["iteration_time"]
    by = table.set_index(["controller", "backend"])
    tg = s["targets"]
    met = lambda ok: "(met)" if ok else "(missed)"  # noqa: E731
    lines = [
        "# Sim-to-real fidelity of the calibrated simulator",
        "",
        "Regenerate (measure and fit the profile, pretrain a policy on it, run the comparison):",
        "",
        "```bash",
        s["commands"]["calibrate"],
        *([s["commands"]["pretrain"]] if s["commands"].get("pretrain") else []),
        s["commands"]["fidelity"],
        "```",
        "",
        f"Made {s['measured_utc'] or s['created_utc']} on {s['machine']}"
        + (
            f" (text and figures rebuilt {s['created_utc']} from the saved measurements, reanalyse=true)"
            if s["reanalysed"]
            else ""
        )
        + ". 1-minute load average while measuring the episodes: "
        f"median {s['loadavg']['median']:.2f}, max {s['loadavg']['max']:.2f} (start {s['loadavg']['start']}, end "
        f"{s['loadavg']['end']}; the two ranks and the coordinator themselves keep it near 1-2); "
        f"{s['loadavg']['note']}. Calibration measured under {s['loadavg']['calibration'][0]} -> "
        f"{s['loadavg']['calibration'][1]}.",
        "",
        "## Setup",
        "",
        f"- Real: {s['setup']['real']}.",
        f"- Calibrated simulator: profile `{s['setup']['profile']}` ({s['setup']['profile_summary']}).",
        f"- Scenario `{s['setup']['scenario']['name']}`: {s['setup']['scenario']['description']}; both backends play "
        "the same `sim.faults.Scenario` (the real one on its wall clock, 1 s of fault time per s).",
        f"- Controllers: {', '.join(labels)}; interval K = {s['setup']['interval']} iterations; real seeds "
        f"{s['setup']['real_seeds']}, simulated seeds {s['setup']['sim_seeds']}; static batches start at their "
        f"batch, the others at local batch {s['setup']['initial_batch']}; time budget {s['setup']['time_budget_s']:g} s.",
        f"- PPO: {s['ppo_bundle_note']}.",
        "",
        "## Summary",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| iteration time, held-out ladder batches: MdAPE <= {100 * tg['iteration_time_mdape']:.0f} % per worker "
        f"type | {', '.join(f'{g} {100 * v:.1f} %' for g, v in it['mdape_by_type'].items())} | "
        f"{met(s['targets_met']['iteration_time_mdape'])} |",
        f"| Kendall's tau, real vs simulated ordering of mean time to accuracy >= {tg['kendall_tau']} | "
        f"{s['ranking']['kendall_tau']:.2f} | {met(s['targets_met']['kendall_tau'])} |",
    ]
    if s.get("ppo"):
        lines.append(
            f"| PPO's advantage over the best static batch, real within {tg['ppo_gap_points']} points of simulated | "
            f"gap {s['ppo']['gap_points']:.1f} points on means ({s['ppo_median']['gap_points']:.1f} on medians) | "
            f"{met(s['targets_met']['ppo_gap_points'])} |"
        )
    bad = [c for c in s.get("collapses", []) if c["controller"] == "ppo"]
    if s.get("ppo") and not s["targets_met"]["ppo_gap_points"] and bad:
        lines += [
            "",
            f"The PPO target is missed on means because {len(bad)} of PPO's {len(s['setup']['real_seeds'])} real "
            "runs diverged (accuracy back to chance after the batch jumped, until the time budget), which the "
            "simulator cannot produce; on medians over seeds the gap is "
            f"{s['ppo_median']['gap_points']:.1f} points. See below.",
        ]
    lines += [
        "",
        "## Iteration time",
        "",
        "| check | worker type | MdAPE | target |",
        "|---|---|---|---|",
    ]
    h = it["holdout"]
    for g, v in it["mdape_by_type"].items():
        lines.append(
            f"| fit on ladder batches {h['fit_batches']}, predict {h['held_out_batches']} (1 and "
            f"{s['setup']['workers']} workers) | {g} | {100 * v:.1f} % | <= {100 * tg['iteration_time_mdape']:.0f} % "
            f"{met(v <= tg['iteration_time_mdape'])} |"
        )
    for w, v in h["mdape_by_workers"].items():
        lines.append(f"| the same, {w} worker(s) only | cpu | {100 * v:.1f} % | |")
    sp = it.get("speed_ladder")
    if sp:
        lines.append(
            f"| {s['setup']['workers']} ranks at speeds {sp['speeds']}, nothing fitted: iteration time | cpu | "
            f"{100 * sp['mdape']:.1f} % | |"
        )
        for w, v in sp["compute_mdape_by_worker"].items():
            lines.append(f"| the same, compute time of {w} | cpu | {100 * v:.1f} % | |")
    ci = it["controller_intervals"]
    lines += [
        f"| every real interval of every controller ({ci['n']} intervals), at its batches and fault state | cpu | "
        f"{100 * ci['mdape']:.1f} % | |",
        "",
        "![predicted vs measured iteration times](iteration_time.png)",
        "",
        "## Time to accuracy and ranking",
        "",
        f"Target validation accuracy {s['setup']['target_accuracy']}. Mean over seeds (+- s.d.); a run that missed "
        "the target within the budget counts its truncation time. Steps and seconds per step: sim / real over the "
        "runs that reached the target (they split a time-to-accuracy error into convergence and speed).",
        "",
        "| controller | real TTA (s) | sim TTA (s) | sim / real | medians real, sim (s) | steps sim / real | "
        "s per step sim / real | reached real | real decision time (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lab in labels:
        r, m, d = by.loc[(lab, "real")], by.loc[(lab, "sim")], s["time_to_accuracy"][lab]
        lines.append(
            f"| {lab} | {r['tta_mean_s']:.2f} +- {r['tta_sd_s']:.2f} | {m['tta_mean_s']:.2f} +- {m['tta_sd_s']:.2f} | "
            f"**{d['ratio_sim_over_real']:.2f}** | {r['tta_median_s']:.2f}, {m['tta_median_s']:.2f} | "
            f"{d['steps_ratio_sim_over_real']:.2f} | {d['s_per_step_ratio_sim_over_real']:.2f} | {d['reached_real']} | "
            f"{r['decision_time_ms']:.1f} |"
        )
    rk, rm = s["ranking"], s["ranking_median"]
    lines += [
        "",
        f"Kendall's tau between the real and simulated orderings of mean time to accuracy: **{rk['kendall_tau']:.2f}** "
        f"(p = {rk['kendall_p']:.4f}; 95 % bootstrap interval over the real runs [{rk['kendall_tau_ci95'][0]:.2f}, "
        f"{rk['kendall_tau_ci95'][1]:.2f}]); target >= {tg['kendall_tau']} {met(rk['kendall_tau'] >= tg['kendall_tau'])}. "
        f"On medians: {rm['kendall_tau']:.2f} ([{rm['kendall_tau_ci95'][0]:.2f}, {rm['kendall_tau_ci95'][1]:.2f}]).",
        "",
        f"- real order (fastest first): {' < '.join(rk['order_real'])}",
        f"- simulated order: {' < '.join(rk['order_sim'])}",
        "",
    ]
    ppo, pm = s.get("ppo"), s.get("ppo_median")
    if ppo:
        lines += [
            f"PPO's advantage over the best static batch (on means): simulated **{ppo['sim']['advantage_pct']:+.1f} %** "
            f"(best static {ppo['sim']['best_static']}), real **{ppo['real']['advantage_pct']:+.1f} %** (best static "
            f"{ppo['real']['best_static']}); gap **{ppo['gap_points']:.1f} points**, target <= {tg['ppo_gap_points']} "
            f"{met(ppo['gap_points'] <= tg['ppo_gap_points'])}. On medians over seeds: simulated "
            f"{pm['sim']['advantage_pct']:+.1f} %, real {pm['real']['advantage_pct']:+.1f} %, gap {pm['gap_points']:.1f} "
            "points.",
            "",
        ]
        pb = s.get("ppo_batches")
        if pb and ppo["sim"]["advantage_pct"] < 0 and ppo["real"]["advantage_pct"] < 0:
            lines[-1:-1] = [
                "",
                f"The pretrained policy was trained on the simulator's CIFAR-10 clusters; here its mean global batch "
                f"is {pb['real']:.0f} (real) / {pb['sim']:.0f} (simulated) against a global batch of "
                f"{pb['best_static']:.0f} for the best static controller, in both backends, hence a negative advantage "
                "in both.",
            ]
    lines += [
        "![time to accuracy](tta.png)",
        "",
        "![accuracy curves](accuracy_curves.png)",
        "",
        "## Where the simulator is wrong",
        "",
        "Measured in this run:",
        "",
    ]
    lines += [f"- {n}" for n in s["where_wrong"]] or ["- nothing beyond the targets above"]
    lines += ["", "Known from the models' construction:", ""] + [f"- {n}" for n in STRUCTURAL]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


def measure(
    cfg: DictConfig,
    profile: ClusterProfile,
    real_config: dict[str, Any],
    scenario: Scenario,
    specs: list[dict[str, Any]],
    interval: int,
) -> dict[str, Any]:
    """Everything measured: the speed ladder, the real episodes, then the simulated ones."""
    budget = float(cfg.time_budget_s)
    quiet = None
    if cfg.quiet.enabled:
        q = cfg.quiet
        quiet = wait_for_quiet(float(q.threshold), float(q.hold_s), float(q.poll_s), float(q.max_wait_s))
    loads = [os.getloadavg()[0]]
    load_start = [round(x, 2) for x in os.getloadavg()]
    speed = speed_ladder(cfg, profile, real_config, scenario) if cfg.speed_ladder.enabled else None
    runs: list[dict[str, Any]] = []
    reals = RealEnvs(real_config, scenario, budget)
    todo = [(seed, sp) for seed in cfg.real_seeds for sp in specs]
    try:
        for seed, sp in tqdm(todo, desc="real episodes", disable=not cfg.progress):
            loads.append(os.getloadavg()[0])
            mode = build_controller(sp["name"], sp["kwargs"]).action_mode
            env = reals.env(sp["initial_batch"], mode, interval, str(cfg.reward))
            runs.append(run_one(env, sp, int(seed), "real", scenario.name))
            log.info(
                "real %s seed %s: %s",
                sp["label"],
                seed,
                f"{runs[-1]['tta_s']:.2f} s" if runs[-1]["reached"] else "target missed",
            )
    finally:
        reals.close()
    loads.append(os.getloadavg()[0])
    load_end = [round(x, 2) for x in os.getloadavg()]
    sims = [(s_, sp) for s_ in cfg.sim_seeds for sp in specs]
    for seed, sp in tqdm(sims, desc="simulated episodes", disable=not cfg.progress):
        mode = build_controller(sp["name"], sp["kwargs"]).action_mode
        env = sim_env(profile, scenario, sp["initial_batch"], mode, interval, str(cfg.reward), budget)
        runs.append(run_one(env, sp, int(seed), "sim", scenario.name))
    timelines = pd.concat([r.pop("timeline") for r in runs], ignore_index=True)
    return {
        "runs": pd.DataFrame(runs),
        "timelines": timelines,
        "speed": speed,
        "conditions": {
            "loads": loads,
            "load_start": load_start,
            "load_end": load_end,
            "quiet": quiet,
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }


def save_measurements(out: Path, m: dict[str, Any]) -> None:
    atomic_write_text(out / "runs.csv", m["runs"].to_csv(index=False))
    atomic_write_text(out / "timelines.csv", m["timelines"].to_csv(index=False))
    atomic_write_text(
        out / "measured.json", dump_json({"speed_ladder": m["speed"], "conditions": m["conditions"]})
    )


def load_measurements(out: Path) -> dict[str, Any]:
    """What a previous run measured (``reanalyse=true``: rebuild the report without measuring)."""
    import json

    doc = json.loads((out / "measured.json").read_text())
    return {
        "runs": pd.read_csv(out / "runs.csv"),
        "timelines": pd.read_csv(out / "timelines.csv"),
        "speed": doc["speed_ladder"],
        "conditions": doc["conditions"],
    }


def fidelity(cfg: DictConfig) -> float:
    out = Path(to_absolute_path(str(cfg.out_dir)))
    ref = str(cfg.profile)
    profile = load_profile(Path(to_absolute_path(ref)) if os.sep in ref else ref)
    prov = profile.meta.get("provenance", {})
    real_config = dict(prov.get("real_config") or {})
    if not real_config:
        raise ValueError(
            f"profile {profile.name!r} was not measured on the real backend (no provenance.real_config)"
        )
    n = int(real_config["workers"])
    interval = int(cfg.interval or prov.get("interval") or 20)
    scenario = build_scenario(cfg, profile)
    ppo_path, ppo_note = resolve_ppo(cfg)
    specs = controller_specs(cfg, ppo_path)
    labels = [sp["label"] for sp in specs]
    static_labels = [sp["label"] for sp in specs if sp["static"]]
    if cfg.get("reanalyse"):
        m = load_measurements(out)
        labels = [lab for lab in labels if lab in set(m["runs"]["controller"])]
    else:
        m = measure(cfg, profile, real_config, scenario, specs, interval)
        out.mkdir(parents=True, exist_ok=True)
        save_measurements(out, m)
    runs_df, timelines, speed, cond = m["runs"], m["timelines"], m["speed"], m["conditions"]

    # iteration time: held-out ladder batches, the speed ladder, every real interval
    table = read_profile_table(profile.path / MEASUREMENTS_FILE)
    additive = list((profile.meta.get("calibration") or {}).get("additive_types") or [])
    holdout = holdout_errors(table, int(cfg.holdout_every), additive_types=additive)
    holdout["mdape_by_workers"] = {
        w: float(np.median([r["ape"] for r in holdout["rows"] if r["workers"] == w]))
        for w in sorted({r["workers"] for r in holdout["rows"]})
    }
    intervals = interval_errors(timelines[timelines.backend == "real"], profile, scenario, n)
    # time to accuracy and ranking
    table_tta = tta_table(runs_df)
    rank = ranking(table_tta, runs_df, labels, seed=0, stat="mean")
    rank_median = ranking(table_tta, runs_df, labels, seed=0, stat="median")
    ppo = ppo_advantage(table_tta, static_labels, "mean")
    ppo_median = ppo_advantage(table_tta, static_labels, "median")

    mdape_by_type = dict(holdout["mdape"])
    loads = cond["loads"]
    by = table_tta.set_index(["controller", "backend"])
    s: dict[str, Any] = {
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "measured_utc": cond.get("measured_utc"),
        "reanalysed": bool(cfg.get("reanalyse")),
        "machine": f"{os.cpu_count()} CPU cores, no GPU",
        "commands": {
            "calibrate": str(prov.get("command", "python -m experiments.calibrate")),
            "pretrain": str(cfg.ppo.get("command") or ""),
            "fidelity": COMMAND + _overrides_text(exclude=("reanalyse",)),
        },
        "loadavg": {
            "start": cond["load_start"],
            "end": cond["load_end"],
            "median": float(np.median(loads)),
            "max": float(np.max(loads)),
            "samples": [round(x, 2) for x in loads],
            "calibration": [prov.get("loadavg_start"), prov.get("loadavg_end")],
            "quiet_wait": cond["quiet"],
            "note": _load_note(cond["quiet"], loads),
        },
        "iteration_time_mdape": mdape_by_type,
        "kendall_tau": rank["kendall_tau"],
        "iteration_time": {
            "mdape_by_type": mdape_by_type,
            "holdout": {k: v for k, v in holdout.items() if k not in ("rows", "fit")},
            "speed_ladder": {k: v for k, v in speed.items() if k != "rows"} if speed else None,
            "controller_intervals": {
                "n": len(intervals),
                "mdape": float(intervals["ape"].median()),
                "mdape_by_controller": intervals.groupby("controller")["ape"].median().to_dict(),
                "median_bias": float(np.median(intervals["predicted_s"] / intervals["measured_s"]) - 1),
            },
        },
        "time_to_accuracy": {
            lab: {
                "real_s": float(by.loc[(lab, "real"), "tta_mean_s"]),
                "sim_s": float(by.loc[(lab, "sim"), "tta_mean_s"]),
                "ratio_sim_over_real": float(
                    by.loc[(lab, "sim"), "tta_mean_s"] / by.loc[(lab, "real"), "tta_mean_s"]
                ),
                "real_median_s": float(by.loc[(lab, "real"), "tta_median_s"]),
                "sim_median_s": float(by.loc[(lab, "sim"), "tta_median_s"]),
                "steps_ratio_sim_over_real": float(
                    by.loc[(lab, "sim"), "steps_mean"] / by.loc[(lab, "real"), "steps_mean"]
                ),
                "s_per_step_ratio_sim_over_real": float(
                    by.loc[(lab, "sim"), "s_per_step"] / by.loc[(lab, "real"), "s_per_step"]
                ),
                "reached_real": f"{int(by.loc[(lab, 'real'), 'reached'])}/{int(by.loc[(lab, 'real'), 'runs'])}",
                "reached_sim": f"{int(by.loc[(lab, 'sim'), 'reached'])}/{int(by.loc[(lab, 'sim'), 'runs'])}",
            }
            for lab in labels
        },
        "ranking": rank,
        "ranking_median": rank_median,
        "ppo": ppo,
        "ppo_median": ppo_median,
        "ppo_bundle": ppo_path,
        "ppo_bundle_note": ppo_note,
        "targets": plain(cfg.targets),
        "setup": {
            "real": f"{n} CPU ranks (gloo), {real_config['model']} on {real_config['dataset']}, base lr "
            f"{real_config.get('base_lr')} ({real_config.get('lr_rule')}), local batches "
            f"[{real_config.get('min_batch')}, {real_config.get('max_batch')}]",
            "workers": n,
            "profile": shown(profile.path),
            "profile_summary": _profile_summary(profile),
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
            "real_seeds": list(cfg.real_seeds),
            "sim_seeds": list(cfg.sim_seeds),
        },
    }
    if ppo is not None:
        best_b = int(str(ppo["real"]["best_static"]).split("-")[1]) * n
        pt = timelines[timelines.controller == "ppo"]
        s["ppo_batches"] = {
            "real": float(pt[pt.backend == "real"]["global_batch"].mean()),
            "sim": float(pt[pt.backend == "sim"]["global_batch"].mean()),
            "best_static": float(best_b),
        }
    s["targets_met"] = {
        "iteration_time_mdape": all(
            v <= s["targets"]["iteration_time_mdape"] for v in mdape_by_type.values()
        ),
        "kendall_tau": rank["kendall_tau"] >= s["targets"]["kendall_tau"],
        "ppo_gap_points": None if ppo is None else ppo["gap_points"] <= s["targets"]["ppo_gap_points"],
    }
    s["collapses"] = collapses(timelines, 1.0 / profile.workload.num_classes)
    s["where_wrong"] = where_wrong(s, table_tta, intervals, labels, timelines, profile)

    out.mkdir(parents=True, exist_ok=True)
    plot_iteration_times(out / "iteration_time.png", holdout, table, speed, intervals, mdape_by_type)
    plot_accuracy(out / "accuracy_curves.png", timelines, labels, profile.workload.target_quality, sim_show=3)
    plot_tta(out / "tta.png", table_tta, runs_df, labels, rank)
    atomic_write_text(out / "summary.json", dump_json(s))
    atomic_write_text(out / "tta_table.csv", table_tta.to_csv(index=False))
    atomic_write_text(out / "intervals.csv", intervals.to_csv(index=False))
    atomic_write_text(out / "report.md", report_markdown(s, table_tta, labels))
    log.info(
        "fidelity report written to %s: tau %.2f, iteration-time MdAPE %s",
        shown(out),
        rank["kendall_tau"],
        ", ".join(f"{g} {100 * v:.1f}%" for g, v in mdape_by_type.items()),
    )
    return float(rank["kendall_tau"])


def _load_note(quiet: dict[str, Any] | None, loads: list[float]) -> str:
    if quiet is None:
        return "no wait for a quiet machine was requested (quiet.enabled=false)"
    if quiet["quiet"]:
        return f"measured after the machine had been quiet (load < threshold) for a minute; waited {quiet['waited_s']:.0f} s"
    return f"the machine did not get quiet within {quiet['waited_s']:.0f} s; measured anyway"


def _profile_summary(profile: ClusterProfile) -> str:
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


def _overrides_text(exclude: Sequence[str] = ()) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        over = HydraConfig.get().overrides.task
    except ValueError:
        return ""
    return "".join(f" {o}" for o in over if o.split("=")[0].lstrip("+~") not in exclude)


@hydra.main(version_base=None, config_path="../conf", config_name="fidelity")
def main(cfg: DictConfig) -> float:
    return fidelity(cfg)


if __name__ == "__main__":
    main()
