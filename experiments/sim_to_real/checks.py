"""The fidelity app's checks computed from measurements: the speed ladder (real step times at the
scenario's static speeds against the simulator's prediction), every real interval's iteration-time
error, the held-out ladder batches, and real runs whose training collapsed."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from dynamix_gym.measurement.compare import SPEED_WINDOWS, IterationPredictor, speeds_at
from dynamix_gym.measurement.profiling import profile_ladder
from sim.faults import Scenario
from sim.fitting.step_time import holdout_errors
from sim.fitting.table import read_profile_table
from sim.profile import MEASUREMENTS_FILE, ClusterProfile


def ladder_holdout(profile: ClusterProfile, every: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """The profile's step-time models fitted on part of its measured ladder, every ``every``-th
    batch predicted (:func:`sim.fitting.step_time.holdout_errors`, MdAPE also per worker count),
    and the measured table."""
    table = read_profile_table(profile.path / MEASUREMENTS_FILE)
    additive = list((profile.meta.get("calibration") or {}).get("additive_types") or [])
    holdout = holdout_errors(table, every, additive_types=additive)
    holdout["mdape_by_workers"] = {
        w: float(np.median([r["ape"] for r in holdout["rows"] if r["workers"] == w]))
        for w in sorted({r["workers"] for r in holdout["rows"]})
    }
    return holdout, table


def speed_ladder(
    cfg: DictConfig, profile: ClusterProfile, real_config: dict[str, Any], scenario: Scenario
) -> dict[str, Any]:
    """Real step times at the scenario's static speeds vs the simulator's prediction (no fitting)."""
    from adapters.config import RealDDPConfig
    from adapters.ddp_backend import DDPBackend
    from adapters.tasks import unreachable_target

    n = int(real_config["workers"])
    speeds = tuple(scenario.worker_speed or (1.0,) * n)
    static = Scenario(name="static_speeds", worker_speed=speeds)
    be = DDPBackend(
        RealDDPConfig(
            **{
                **real_config,
                "scenario": static,
                "fault_time_scale": 1.0,
                **unreachable_target(real_config["dataset"]),
            }
        )
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
    """Every real interval's mean iteration time vs the simulator's at its batches and speeds.

    A speed window that opens or closes inside an interval (the real ranks take it at its time, as
    the simulator does) splits the interval into segments of constant speeds: the predicted mean
    iteration time is their total time over the iterations they hold (sum d_j / sum d_j / T_j)."""
    pred = IterationPredictor(profile)
    edges = sorted(
        {
            t
            for w in scenario.windows
            if w.kind in SPEED_WINDOWS
            for t in (w.start_s, w.start_s + w.duration_s)
        }
    )
    rows = []
    for r in timelines.itertuples(index=False):
        d = r._asdict()
        b = np.array([d[f"w{i}_batch"] for i in range(n)], dtype=np.float64)
        measured = float(np.mean([d[f"w{i}_iteration_time_s"] for i in range(n)]))
        end = float(d["wall_time_s"])
        start = max(end - float(d["interval_time_s"]), 0.0)
        speeds = speeds_at(scenario, n, start)
        cuts = [start, *(t for t in edges if start < t < end), end]
        if len(cuts) == 2:
            p = pred.iteration_time_s(b, speeds)
        else:
            segs = [
                (hi - lo, pred.iteration_time_s(b, speeds_at(scenario, n, lo)))
                for lo, hi in itertools.pairwise(cuts)
            ]
            p = sum(dt for dt, _ in segs) / sum(dt / t for dt, t in segs)
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
