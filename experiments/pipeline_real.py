"""The pipeline controllers on real stage ranks under an interference burst, and the same runs simulated.

    python -m experiments.pipeline_real                  # conf/pipeline_real.yaml

``dynamix/RealPipeline-v1`` (two CPU gloo stage ranks, the digits job, an emulated burst: stage
rank ``burst.stage`` computes ``burst.factor`` times longer from ``burst.start_s``) driven to the
target accuracy by each controller, for each seed; the controllers' order rotates from seed to
seed, so the machine's load falls on all alike, and ``os.getloadavg`` is recorded around each run.
Each real run is then replayed on the calibrated twin (:mod:`adapters.real_pipeline.twin`, the same
controller code and seed): a controller's real step count to the target is fixed by the seed and
its micro-batch choices (the data order does not depend on the partition), so the twin's time to
the target is its wall time when it has trained the samples the real run trained. Written to
``out``: every run with its interval log (partition, stage times, slow-downs), the medians per
controller, the ratios to the even split, and Kendall's tau between the real and simulated times
(over the runs, and over the controllers' medians).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
from omegaconf import DictConfig
from scipy.stats import kendalltau

from adapters.real_pipeline.env import RealPipelineEnv
from adapters.real_pipeline.twin import RealJob, burst_scenario, load_calibration, twin_env
from dynamix_gym.pipeline.controllers import CONTROLLERS, DynPipeController
from dynamix_gym.pipeline.evaluation import run_pipeline_episode
from dynamix_gym.pipeline.policy import PolicyController
from experiments.common import REPO_ROOT, atomic_write_text, hydra_app, plain

log = logging.getLogger(__name__)


def make_controller(name: str, cfg: DictConfig):
    if name == "policy":
        return PolicyController(REPO_ROOT / cfg.policy)
    if name == "dynpipe":
        return DynPipeController(**plain(cfg.dynpipe))
    return CONTROLLERS[name]()


def twin_time_to(env, controller, seed: int, samples: int, max_steps: int) -> float:
    """The twin's wall time when it has trained ``samples`` samples under ``controller`` (its own
    accuracy, from a convergence model of another workload, ends nothing here)."""
    obs, info = env.reset(seed=seed, options=controller.start_options(env, seed))
    controller.reset(env)
    for _ in range(max_steps):
        if info["report"].samples >= samples:
            return float(info["report"].wall_time_s)
        action, _ = controller.predict(obs, info)
        obs, _, _, _, info = env.step(action)
    return math.inf


def run(cfg: DictConfig) -> dict:
    job = RealJob(**plain(cfg.job))
    cal = load_calibration()
    scenario = burst_scenario(**plain(cfg.burst))
    out = Path(cfg.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    names = list(cfg.controllers)
    runs: list[dict] = []
    if cfg.get("replay_from"):  # the real runs of an earlier campaign: only the twin runs again
        runs = json.loads((REPO_ROOT / cfg.replay_from).read_text())["runs"]
    for i, seed in enumerate([] if runs else cfg.seeds):
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate: load hits all alike
        for name in order:
            env = RealPipelineEnv(scenario, job=job, calibration=cal, target_quality=float(cfg.target),
                                  interval=int(cfg.interval), interval_s=cfg.interval_s, time_budget_s=float(cfg.time_budget_s),
                                  timeout_s=float(cfg.timeout_s))  # fmt: skip
            load0, t0 = os.getloadavg(), time.perf_counter()
            try:
                row = run_pipeline_episode(env, make_controller(name, cfg), int(seed))
                backend = env.sim
                row.update(log=backend.log, load_before=list(load0),
                           load_after=list(os.getloadavg()), elapsed_s=time.perf_counter() - t0)  # fmt: skip
            finally:
                env.close()
            runs.append(row)
            log.info("seed %s %s: %s to target %.1f s (%d re-partitions, final %s), load %.1f",
                     seed, name, "reached" if row["reached_target"] else "NOT reached", row["time_to_target_s"],
                     row["repartitions"], row["final_sizes"], row["load_after"][0])  # fmt: skip
            atomic_write_text(
                out, json.dumps({"runs": runs, "partial": True}, indent=1, default=float) + "\n"
            )
    twin = twin_env(job, cal, scenario, interval=int(cfg.interval), interval_s=cfg.interval_s, target_quality=float(cfg.target),
                    time_budget_s=float(cfg.time_budget_s))  # fmt: skip
    for row in runs:
        row["sim_time_to_target_s"] = (
            twin_time_to(twin, make_controller(row["controller"], cfg), row["seed"], row["samples"], 10_000)
            if row["reached_target"] else math.inf
        )  # fmt: skip
    real = np.array([r["time_to_target_s"] for r in runs])
    sim = np.array([r["sim_time_to_target_s"] for r in runs])
    ok = np.isfinite(real) & np.isfinite(sim)
    med = {n: float(np.median([r["time_to_target_s"] for r in runs if r["controller"] == n])) for n in names}
    med_sim = {
        n: float(np.median([r["sim_time_to_target_s"] for r in runs if r["controller"] == n])) for n in names
    }
    result = {
        "median_time_to_target_s": med,
        "median_sim_time_to_target_s": med_sim,
        "ratio_to_even": {n: med[n] / med["even"] for n in names} if "even" in med else {},
        "per_seed_ratio_to_even": {
            n: [
                r["time_to_target_s"] / e["time_to_target_s"]
                for r in runs
                for e in runs
                if r["controller"] == n and e["controller"] == "even" and e["seed"] == r["seed"]
            ]
            for n in names
        },
        "kendall_tau_runs": float(kendalltau(real[ok], sim[ok]).statistic) if ok.sum() > 1 else float("nan"),
        "kendall_tau_medians": float(
            kendalltau([med[n] for n in names], [med_sim[n] for n in names]).statistic
        ),
        "sim_time_ape_runs": (np.abs(sim[ok] - real[ok]) / real[ok]).tolist(),
        "runs": runs,
        "config": plain(cfg),
    }
    atomic_write_text(out, json.dumps(result, indent=1, default=float) + "\n")
    log.info("medians %s; sim %s; tau runs %.2f, medians %.2f", med, med_sim, result["kendall_tau_runs"],
             result["kendall_tau_medians"])  # fmt: skip
    return result


main = hydra_app("pipeline_real", run, "kendall_tau_medians", __spec__)


if __name__ == "__main__":
    main()
