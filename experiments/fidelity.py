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

``reanalyse=true`` rebuilds the report from ``out_dir``'s measurements; with ``resimulate=true`` too,
the real episodes are kept and the simulated ones run again in the campaign's profile as it is now
(after a change of the simulator, or a refit of the profile's models).

Writes ``report.md`` (the commands that regenerate it at its top), ``summary.json``, ``runs.csv``,
``timelines.csv`` and the PNGs into ``out_dir``. Returns Kendall's tau.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig
from tqdm.auto import tqdm

from adapters.sim2real import (
    RealEnvs,
    build_scenario,
    controller_specs,
    real_profile,
    run_one,
    sim_env,
    spec_controller,
)
from dynamix_gym.controllers.base import env_options
from dynamix_gym.measurement.compare import ppo_advantage, ranking, tta_table
from dynamix_gym.measurement.profiling import quiet_wait
from experiments.common import atomic_write_text, shown
from experiments.obs_gap import read_gap
from experiments.reports.fidelity_plots import plot_accuracy, plot_iteration_times, plot_tta
from experiments.reports.fidelity_report import construction_notes, report_markdown, where_wrong
from experiments.reports.markdown import overrides_text
from experiments.sim_to_real import summary as fs
from experiments.sim_to_real.checks import collapses, interval_errors, ladder_holdout, speed_ladder
from experiments.sim_to_real.deployment import (
    calibrate_and_finetune,
    deployment_lines,
    deployment_summary,
    reloaded,
)
from sim.datafiles import dump_json
from sim.faults import Scenario
from sim.profile import ClusterProfile

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.fidelity"


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


@dataclass(frozen=True)
class Setup:
    """What a fidelity run compares: the profile, the real backend it was measured on, the
    scenario both play, the controllers (:func:`adapters.sim2real.controller_specs`), K."""

    cfg: DictConfig
    profile: ClusterProfile
    real_config: dict[str, Any]
    scenario: Scenario
    specs: list[dict[str, Any]]
    interval: int
    #: the profile whose measured ladder the held-out check refits (the stored one: a quick refit
    #: keeps none); None: ``profile``
    ladder_of: ClusterProfile | None = None


def measure(setup: Setup) -> dict[str, Any]:
    """Everything measured: the speed ladder, the real episodes, then the simulated ones."""
    cfg, profile, real_config, scenario = setup.cfg, setup.profile, setup.real_config, setup.scenario
    specs, interval = setup.specs, setup.interval
    budget = float(cfg.time_budget_s)
    quiet = quiet_wait(cfg.quiet)
    loads = [os.getloadavg()[0]]
    load_start = [round(x, 2) for x in os.getloadavg()]
    speed = speed_ladder(cfg, profile, real_config, scenario) if cfg.speed_ladder.enabled else None
    runs: list[dict[str, Any]] = []
    reals = RealEnvs(
        real_config, scenario, budget, compute_profile=None if profile.path is None else str(profile.path)
    )
    todo = [(seed, sp) for seed in cfg.real_seeds for sp in specs]
    try:
        for seed, sp in tqdm(todo, desc="real episodes", disable=not cfg.progress):
            loads.append(os.getloadavg()[0])
            ctrl = spec_controller(sp)
            env = reals.env(
                sp["initial_batch"], ctrl.action_mode, interval, str(cfg.reward), env_options(ctrl)
            )
            runs.append(run_one(env, sp, int(seed), "real", scenario.name, ctrl))
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
    runs += simulate(setup)
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
            "measured_utc": fs.now_utc(),
        },
    }


def simulate(setup: Setup) -> list[dict[str, Any]]:
    """The simulated episodes: every controller on every simulated seed, in ``setup.profile``."""
    cfg, profile, scenario, interval = setup.cfg, setup.profile, setup.scenario, setup.interval
    runs = []
    sims = [(s_, sp) for s_ in cfg.sim_seeds for sp in setup.specs]
    for seed, sp in tqdm(sims, desc="simulated episodes", disable=not cfg.progress):
        ctrl = spec_controller(sp)
        env = sim_env(
            profile,
            scenario,
            sp["initial_batch"],
            ctrl.action_mode,
            interval,
            str(cfg.reward),
            float(cfg.time_budget_s),
            env_options(ctrl),
        )
        runs.append(run_one(env, sp, int(seed), "sim", scenario.name, ctrl))
    return runs


def resimulated(setup: Setup, m: dict[str, Any]) -> dict[str, Any]:
    """``resimulate=true`` (with ``reanalyse=true``): the measured real episodes kept, the simulated
    ones run again in the campaign's profile as it is now (after a change of the simulator or a
    refit of the profile's models), so that a campaign's ranking is re-read without measuring."""
    runs = simulate(setup)
    sim_tl = pd.concat([r.pop("timeline") for r in runs], ignore_index=True)
    real_runs = m["runs"][m["runs"].backend != "sim"]
    real_tl = m["timelines"][m["timelines"].backend != "sim"]
    conditions = dict(m["conditions"]) | {"resimulated_utc": fs.now_utc()}
    return m | {
        "runs": pd.concat([real_runs, pd.DataFrame(runs)], ignore_index=True),
        "timelines": pd.concat([real_tl, sim_tl], ignore_index=True),
        "conditions": conditions,
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


def analyse(setup: Setup, labels: list[str], m: dict[str, Any]) -> dict[str, Any]:
    """The summary (``summary.json``) of the measurements ``m``, and the tables behind it."""
    cfg, profile, real_config, scenario = setup.cfg, setup.profile, setup.real_config, setup.scenario
    specs, interval = setup.specs, setup.interval
    prov = profile.meta.get("provenance", {})
    n = int(real_config["workers"])
    runs_df, timelines, speed = m["runs"], m["timelines"], m["speed"]
    holdout, ladder = ladder_holdout(setup.ladder_of or profile, int(cfg.holdout_every))
    intervals = interval_errors(timelines[timelines.backend == "real"], profile, scenario, n)
    tta = tta_table(runs_df)
    static = {sp["label"]: sp["batch"] for sp in specs if sp["static"]}
    rank = ranking(tta, runs_df, labels, seed=0, stat="mean")
    ppo = ppo_advantage(tta, list(static), "mean")
    it = fs.iteration_summary(holdout, speed, intervals)
    s: dict[str, Any] = {
        "created_utc": fs.now_utc(),
        "measured_utc": m["conditions"].get("measured_utc"),
        "reanalysed": bool(cfg.get("reanalyse")),
        "machine": fs.machine(),
        "commands": {
            "calibrate": str(prov.get("command", "python -m experiments.calibrate")),
            "pretrain": str(cfg.ppo.get("command") or ""),
            "fidelity": COMMAND + overrides_text(exclude=("reanalyse",)),
        },
        "loadavg": fs.loadavg_summary(m["conditions"], prov),
        "iteration_time_mdape": it["mdape_by_type"],
        "kendall_tau": rank["kendall_tau"],
        "iteration_time": it,
        "time_to_accuracy": fs.tta_summary(tta, labels),
        "ranking": rank,
        "ranking_median": ranking(tta, runs_df, labels, seed=0, stat="median"),
        "ppo": ppo,
        "ppo_median": ppo_advantage(tta, list(static), "median"),
        "ppo_bundle": m["ppo_path"],
        "ppo_bundle_note": m["ppo_note"],
        "targets": fs.targets(cfg),
        "setup": fs.setup_summary(cfg, profile, real_config, scenario, interval),
    }
    if ppo is not None:
        s["ppo_batches"] = fs.ppo_batches(timelines, static[ppo["real"]["best_static"]], n)
    s["targets_met"] = fs.targets_met(s)
    s["collapses"] = collapses(timelines, profile.workload.chance_quality)
    if m.get("deploy") is not None:  # calibrated right before / fine-tuned: the deployment verdicts
        s["deployment"] = deployment_summary(runs_df, specs, s["collapses"], m["deploy"], s["targets"])
    s["where_wrong"] = where_wrong(s, tta, intervals, labels, profile)
    return {"summary": s, "tta": tta, "intervals": intervals, "holdout": holdout, "ladder": ladder}


def write_report(
    cfg: DictConfig, out: Path, profile: ClusterProfile, labels: list[str], m: dict, a: dict
) -> None:
    s, tta, intervals = a["summary"], a["tta"], a["intervals"]
    out.mkdir(parents=True, exist_ok=True)
    mdape = s["iteration_time_mdape"]
    plot_iteration_times(out / "iteration_time.png", a["holdout"], a["ladder"], m["speed"], intervals, mdape)
    target = profile.workload.target_quality
    plot_accuracy(out / "accuracy_curves.png", m["timelines"], labels, target, sim_show=3)
    plot_tta(out / "tta.png", tta, m["runs"], labels, s["ranking"])
    atomic_write_text(out / "summary.json", dump_json(s))
    atomic_write_text(out / "tta_table.csv", tta.to_csv(index=False))
    atomic_write_text(out / "intervals.csv", intervals.to_csv(index=False))
    gap_path = Path(to_absolute_path(str(cfg.observation_gap)))
    gap = read_gap(gap_path) if gap_path.is_file() else None
    known = construction_notes(profile, a["ladder"], gap, shown(gap_path))
    report = report_markdown(s, tta, labels, known)
    if s.get("deployment") is not None:
        report = report.rstrip("\n") + "\n\n" + "\n".join(deployment_lines(s["deployment"])) + "\n"
    atomic_write_text(out / "report.md", report)


def fidelity(cfg: DictConfig) -> float:
    out = Path(to_absolute_path(str(cfg.out_dir)))
    profile, real_config = real_profile(str(cfg.profile))
    interval = int(cfg.interval or (profile.meta.get("provenance") or {}).get("interval") or 20)
    scenario = build_scenario(cfg.scenario, profile)
    ppo_path, ppo_note = resolve_ppo(cfg)
    specs = controller_specs(cfg.controllers, int(cfg.initial_batch), ppo_path)
    stored = profile
    if cfg.get("reanalyse"):
        profile, specs, record = reloaded(out, cfg, profile, specs)
        m = load_measurements(out)
        if cfg.get("resimulate"):
            m = resimulated(Setup(cfg, profile, real_config, scenario, specs, interval), m)
            save_measurements(out, m)
    else:  # the profile measured right before the runs, bundles fine-tuned in it (deployment.py)
        profile, specs, record = calibrate_and_finetune(
            cfg, profile, real_config, scenario, specs, interval, out
        )
        m = measure(Setup(cfg, profile, real_config, scenario, specs, interval))
        out.mkdir(parents=True, exist_ok=True)
        save_measurements(out, m)
    setup = Setup(cfg, profile, real_config, scenario, specs, interval, ladder_of=stored)
    labels = [sp["label"] for sp in specs if sp["label"] in set(m["runs"]["controller"])]
    # fine-tuning needs the quick calibration: a campaign calibrated right before is a deployment
    deployed = record if record["calibration"] is not None else None
    m |= {"ppo_path": ppo_path, "ppo_note": ppo_note, "deploy": deployed}
    a = analyse(setup, labels, m)
    write_report(cfg, out, profile, labels, m, a)
    tau = float(a["summary"]["kendall_tau"])
    log.info(
        "fidelity report written to %s: tau %.2f, iteration-time MdAPE %s",
        shown(out),
        tau,
        ", ".join(f"{g} {100 * v:.1f}%" for g, v in a["summary"]["iteration_time_mdape"].items()),
    )
    return tau


@hydra.main(version_base=None, config_path="../conf", config_name="fidelity")
def main(cfg: DictConfig) -> float:
    return fidelity(cfg)


if __name__ == "__main__":
    main()
