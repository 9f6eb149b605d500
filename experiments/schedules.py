"""Does a changing batch cost accuracy? Batch schedules on real DDP training and in the calibrated simulator.

    python -m experiments.schedules [quiet.enabled=true] [reanalyse=true] [real=false] [schedules=[...]]

Runs every schedule of ``conf/schedules.yaml`` (static batches, increasing and decreasing schedules
on validation accuracy, an uneven per-worker split) in each learning-rate regime (no scaling and
AdaScale) on the real backend (the calibrated profile's real task: 2 CPU ranks) for ``real_seeds``
and in the simulator calibrated to it for ``sim_seeds``, every run for ``time_budget_s`` (no early
stop: the curves run to their plateau). Each run is saved as one JSON file under ``out_dir/runs``
as soon as it ends, so an interrupted campaign resumes where it stopped. The comparison (time to
target, final accuracy, Kendall's tau of the schedules' ranking, seconds per step by batch) is in
:mod:`experiments.reports.schedules`, written to ``report`` with its figures.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from adapters.config import real_config_of
from adapters.sim2real import RealEnvs, build_scenario
from dynamix_gym.controllers.schedule import AccuracyScheduleController, parse_phases
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.measurement.profiling import quiet_wait
from experiments.common import atomic_write_text
from sim.convergence import LR_RULES
from sim.faults import Scenario
from sim.profile import ClusterProfile, load_profile

log = logging.getLogger(__name__)

#: Validation accuracy a run is given as its target: out of reach, so every run trains its whole budget.
PLATEAU_TARGET = 0.999


def schedule_library(cfg: DictConfig) -> list[dict[str, Any]]:
    """The schedules to run: ``cfg.schedules`` (names) out of ``cfg.library``, phases checked."""
    lib = OmegaConf.to_container(cfg.library, resolve=True)
    names = list(lib) if cfg.schedules is None else [str(n) for n in cfg.schedules]
    unknown = [n for n in names if n not in lib]
    if unknown:
        raise ValueError(f"schedules: unknown names {unknown}; the library has {sorted(lib)}")
    out = []
    for name in names:
        entry = dict(lib[name])
        parse_phases(entry["phases"], where=f"library.{name}")
        out.append({"name": name, "kind": str(entry.get("kind", "")), "phases": entry["phases"]})
    return out


def check_regimes(regimes: Any) -> list[str]:
    out = [str(r) for r in regimes]
    bad = [r for r in out if r not in LR_RULES]
    if not out or bad:
        raise ValueError(f"regimes must list learning-rate rules out of {list(LR_RULES)}, got {out}")
    return out


def quiet_scenario(profile: ClusterProfile, workers: int) -> Scenario:
    """No faults, equal speeds, the profile's measured per-iteration compute spread."""
    doc = {
        "name": "schedules",
        "description": "no faults: every rank at full speed",
        "worker_speed": [1.0] * workers,
    }
    return build_scenario(doc, profile)


def sim_env(
    profile: ClusterProfile,
    scenario: Scenario,
    regime: str,
    interval: int,
    budget_s: float,
    task: dict[str, Any],
) -> HeteroClusterEnv:
    """The calibrated simulator under the same rules as the real runs (batch range, target, budget)."""
    workload = replace(profile.workload, target_accuracy=PLATEAU_TARGET)
    return HeteroClusterEnv(
        profile=profile,
        workload=workload,
        scenario=scenario,
        interval=interval,
        action_mode="absolute",
        reward="time",
        time_budget_s=budget_s,
        sim_kwargs={"lr_rule": regime, "min_batch": int(task.get("min_batch", 8))},
    )


def step_time_check(
    backend: Any, profile: ClusterProfile, batches: list[int], intervals: int, k: int
) -> dict:
    """Measured against predicted compute per iteration on ``backend`` at each local batch of
    ``batches`` (every worker at it; the first of ``intervals`` intervals is a warm-up): a profile
    calibrated on another day, or on another machine state, shows here before the campaign runs.
    Per batch: the median over intervals of the ranks' mean compute (``measured_s``, against the
    prediction) and of the slowest rank's (``measured_max_s``, what the iteration waits for)."""
    from dynamix_gym.measurement.compare import IterationPredictor

    n = backend.spec.num_workers
    predictor = IterationPredictor(profile)
    backend.reset(seed=0)
    rows = []
    for b in batches:
        local = np.full(n, int(b))
        reports = [backend.run_interval(local, k) for _ in range(intervals)]
        measured = float(np.median([r.compute_time_s.mean() for r in reports[1:]]))
        slowest = float(np.median([r.compute_time_s.max() for r in reports[1:]]))
        predicted = float(predictor.compute_time_s(local, (1.0,) * n).mean())
        rows.append({"local_batch": int(b), "measured_s": measured, "measured_max_s": slowest,
                     "predicted_s": predicted, "ratio": predicted / measured})  # fmt: skip
    return {"rows": rows, "max_drift": float(max(abs(r["ratio"] - 1.0) for r in rows))}


def run_one(env: HeteroClusterEnv, schedule: dict[str, Any], seed: int) -> dict[str, Any]:
    """One run of ``schedule``: its summary and its timeline (one row per interval)."""
    ctrl = AccuracyScheduleController(schedule["phases"])
    res = run_episode(env, ctrl, seed, scenario="schedules")
    keep = ("total_time_s", "final_accuracy", "decisions", "batch_changes", "decision_time_ms")
    return {"summary": {k: res.summary[k] for k in keep}, "timeline": res.timeline}


#: The fine step-time ladder of the real backend (``ladder`` in conf/schedules.yaml) under ``out_dir``.
LADDER_FILE = "step_ladder.json"


def run_path(out: Path, backend: str, regime: str, name: str, seed: int) -> Path:
    return out / "runs" / f"{backend}-{regime}-{name}-s{seed}.json"


def save_run(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, default=float))


def campaign(
    cfg: DictConfig, profile: ClusterProfile, sim_profile: ClusterProfile, out: Path
) -> dict[str, Any]:
    """Run what is not saved yet: real runs first (on a quiet machine), then the simulated ones
    (in ``sim_profile``, saved as backend ``cfg.sim_label``)."""
    schedules, regimes = schedule_library(cfg), check_regimes(cfg.regimes)
    task = real_config_of(profile)
    interval = int(cfg.interval or (profile.meta.get("provenance") or {}).get("interval") or 20)
    budget = float(cfg.time_budget_s)
    scenario = quiet_scenario(profile, int(task.get("workers", 2)))
    todo = []
    sim_label = str(cfg.sim_label)
    for backend, seeds in (("real", cfg.real_seeds if cfg.real else []), (sim_label, cfg.sim_seeds)):
        for regime in regimes:
            for seed in seeds:
                for s in schedules:
                    path = run_path(out, backend, regime, s["name"], int(seed))
                    if not path.exists():
                        todo.append((backend, regime, s, int(seed), path))
    conditions: dict[str, Any] = {"load_start": [round(x, 2) for x in os.getloadavg()], "loads": []}
    if any(t[0] == "real" for t in todo):
        conditions["quiet"] = quiet_wait(cfg.quiet)
    reals = RealEnvs(task, scenario, budget, target_accuracy=PLATEAU_TARGET)
    try:
        sc = cfg.step_check
        if sc.enabled and any(t[0] == "real" for t in todo):
            env = reals.env(None, "absolute", interval, "time", lr_rule=regimes[0])
            check = step_time_check(
                env.unwrapped.backend, sim_profile, list(sc.batches), int(sc.intervals), interval
            )
            conditions["step_check"] = check
            log.info(
                "step-time check: simulated / measured compute %s",
                [round(r["ratio"], 2) for r in check["rows"]],
            )
            if check["max_drift"] > float(sc.max_drift) and sc.refuse:
                raise RuntimeError(
                    f"step_check: the profile's compute times are off by up to {check['max_drift']:.0%} on this "
                    f"machine now (max_drift {float(sc.max_drift):.0%}); recalibrate, or set step_check.refuse=false"
                )
        lad = cfg.get("ladder")
        if lad is not None and lad.enabled and cfg.real and not (out / LADDER_FILE).exists():
            conditions.setdefault("quiet", quiet_wait(cfg.quiet))
            env = reals.env(None, "absolute", interval, "time", lr_rule=regimes[0])
            load0 = os.getloadavg()[0]
            rows = step_time_check(
                env.unwrapped.backend, sim_profile, list(lad.batches), int(lad.intervals), interval
            )
            doc = {**rows, "interval": interval, "intervals": int(lad.intervals), "load_start": load0,
                   "load_end": os.getloadavg()[0], "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
            save_run(out / LADDER_FILE, doc)
            log.info(
                "step ladder: %s", [(r["local_batch"], round(1e3 * r["measured_s"], 2)) for r in rows["rows"]]
            )
        for backend, regime, s, seed, path in tqdm(todo, desc="schedule runs", disable=not cfg.progress):
            if backend == "real":
                conditions["loads"].append(os.getloadavg()[0])
                env = reals.env(None, "absolute", interval, "time", lr_rule=regime)
            else:
                env = sim_env(sim_profile, scenario, regime, interval, budget, task)
            rec = run_one(env, s, seed)
            rec.update(backend=backend, regime=regime, schedule=s["name"], kind=s["kind"], seed=seed)
            save_run(path, rec)
            log.info("%s %s %s seed %d: final accuracy %.3f", backend, regime, s["name"], seed,
                     rec["summary"]["final_accuracy"])  # fmt: skip
    finally:
        reals.close()
    conditions["load_end"] = [round(x, 2) for x in os.getloadavg()]
    conditions["measured_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"schedules": schedules, "regimes": regimes, "interval": interval, "budget_s": budget,
            "task": task, "conditions": conditions, "ran": len(todo)}  # fmt: skip


def load_runs(out: Path, sim_label: str = "sim") -> list[dict[str, Any]]:
    """The real runs and the simulated runs labelled ``sim_label`` (renamed ``sim`` for the analysis)."""
    runs = []
    for p in sorted((out / "runs").glob("*.json")):
        rec = json.loads(p.read_text())
        if rec["backend"] in ("real", sim_label):
            runs.append({**rec, "backend": "real" if rec["backend"] == "real" else "sim"})
    return runs


def schedules_app(cfg: DictConfig) -> float:
    """Measure what is missing (unless ``reanalyse``), then write the report; returns the lowest
    Kendall's tau over the regimes (nan without real runs)."""
    from experiments.reports.schedules import analyse, write_report

    profile = load_profile(to_absolute_path(str(cfg.profile)))
    sim_profile = profile if cfg.sim_profile is None else load_profile(to_absolute_path(str(cfg.sim_profile)))
    out = Path(to_absolute_path(str(cfg.out_dir)))
    meta_path = out / "schedules.json"
    if cfg.reanalyse:
        if not meta_path.exists():
            raise FileNotFoundError(f"reanalyse=true but {meta_path} does not exist: measure first")
        meta = json.loads(meta_path.read_text())
    else:
        meta = campaign(cfg, profile, sim_profile, out)
        meta["conditions_history"] = (
            json.loads(meta_path.read_text()).get("conditions_history", []) if meta_path.exists() else []
        ) + [meta.pop("conditions")]
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(meta_path, json.dumps(meta, indent=1, default=float))
    runs = load_runs(out, str(cfg.sim_label))
    if not runs:
        raise RuntimeError(f"no runs under {out / 'runs'}")
    plain = OmegaConf.to_container(cfg, resolve=True)
    result = analyse(runs, meta, plain)
    write_report(Path(to_absolute_path(str(cfg.report))), result, {**meta, "out_dir": str(cfg.out_dir), "sim_profile": str(cfg.sim_profile or cfg.profile)}, sim_profile,
                 plain["checks"])  # fmt: skip
    taus = [r["kendall_tau"] for r in result["regimes"].values() if r.get("kendall_tau") is not None]
    return float(min(taus)) if taus else float(np.nan)


@hydra.main(version_base="1.3", config_path="../conf", config_name="schedules")
def main(cfg: DictConfig) -> float:
    return schedules_app(cfg)


if __name__ == "__main__":
    main()
