"""Calibrate the simulator's model of the real pipeline from its stage ranks, and score it on held-out partitions.

    python -m experiments.pipeline_fidelity              # conf/pipeline_fidelity.yaml

Runs the digits job (:class:`adapters.real_pipeline.twin.RealJob`) on two CPU gloo stage ranks
through a list of plans (partition, micro-batches, each rank's emulated slow-down), carrying the
blocks' state from plan to plan as a re-partition does. Each plan: ``warmup`` steps discarded,
then ``steps`` measured (each stage's forward and backward per micro-batch, the iteration time).
With ``rounds`` > 1 the whole list runs that many times over, interleaved (plan 1, 2, ..., n, then
1, 2, ... again), and each plan's figures are the medians over its rounds: a load that comes and
goes on a shared machine then falls on every plan alike instead of on the few measured while it
lasted (each round's own figures stay in the row's ``rounds``).

Calibration (the ``calibrate`` plans, never the held-out ones):

    block times   stage s's measured forward (backward) = sum of its blocks', each block's
                  c0 + c1 * its GFLOPs (a per-block overhead and a rate) -> non-negative least
                  squares (scipy.optimize.nnls) for c0, c1, hence the per-block table
    link          (bandwidth, latency) of a send minimising the squared log error of the twin's
                  1F1B iteration time against the measured (scipy.optimize.least_squares)
    pause         the median measured restart between plans (stop, state by name, start)

Written to ``calibration_out`` (``sim/data/pipeline_cpu_gloo.json``, read by the twin). The
held-out plans then give the absolute percentage errors of the twin's per-stage compute
(forward + backward per micro-batch) and iteration time; their medians (MdAPE) go to ``out``.
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
from scipy.optimize import least_squares, nnls

from adapters.real_pipeline.ranks import StagePool
from adapters.real_pipeline.twin import RealJob, cpu_cluster, digits_blocks, twin_model, twin_simulator
from experiments.common import REPO_ROOT, atomic_write_text, hydra_app, plain
from sim.pipeline.partition import bounds

log = logging.getLogger(__name__)


def measure_plans(job: RealJob, plans: list[dict], cfg: DictConfig) -> tuple[list[dict], list[float]]:
    """Run every plan on the ranks, ``cfg.rounds`` times interleaved (module docstring); per plan
    the medians over its rounds of its measured stage times and iteration time, and the measured
    restarts between plans."""
    rounds = int(cfg.get("rounds", 1))
    if rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds}")
    runs: list[list[dict]] = [[] for _ in plans]
    pauses, pool, state, optim, step = [], None, None, None, 0
    try:
        for k in range(rounds):
            for i, plan in enumerate(plans):
                sizes, m = tuple(int(s) for s in plan["sizes"]), int(plan["micro_batches"])
                t0 = time.perf_counter()
                if pool is not None:
                    state, optim = pool.stop()
                pool = StagePool([int(x) for x in bounds(sizes)], micro_batches=m, batch=m * job.micro_batch,
                                 state=state, optim=optim, schedule=job.schedule, num_blocks=job.num_blocks,
                                 hidden=job.hidden, seed=int(cfg.seed), lr=job.lr, timeout_s=float(cfg.timeout_s))  # fmt: skip
                if step:
                    pauses.append(time.perf_counter() - t0)
                slow = [float(x) for x in plan.get("slowdown", [1.0] * len(sizes))]
                pool.run(int(cfg.warmup), first_step=step, slowdown=slow)
                ran = pool.run(int(cfg.steps), first_step=step + int(cfg.warmup), slowdown=slow)
                step += int(cfg.warmup) + int(cfg.steps)
                one = {
                    "fwd_s": [float(np.median(a["fwd_s"])) for a in ran],
                    "bwd_s": [float(np.median(a["bwd_s"])) for a in ran],
                    "iteration_s": float(np.median(np.max([a["step_s"] for a in ran], axis=0))),
                    "load_1min": os.getloadavg()[0],
                }
                runs[i].append(one)
                log.info("round %d/%d plan %s M=%d slow=%s: iteration %.3f s, stage f %s b %s", k + 1, rounds,
                         list(sizes), m, slow, one["iteration_s"], np.round(one["fwd_s"], 4),
                         np.round(one["bwd_s"], 4))  # fmt: skip
        if pool is not None:
            pool.stop()
    finally:
        if pool is not None:
            pool.close()
    return [_row(plan, done) for plan, done in zip(plans, runs, strict=True)], pauses


def _row(plan: dict, done: list[dict]) -> dict:
    """One plan's figures: the medians over its rounds (each round's own under ``rounds``)."""
    sizes = [int(s) for s in plan["sizes"]]
    return {
        "sizes": sizes, "micro_batches": int(plan["micro_batches"]),
        "slowdown": [float(x) for x in plan.get("slowdown", [1.0] * len(sizes))],
        "held_out": bool(plan.get("held_out")),
        "fwd_s": np.median([r["fwd_s"] for r in done], axis=0).tolist(),
        "bwd_s": np.median([r["bwd_s"] for r in done], axis=0).tolist(),
        "iteration_s": float(np.median([r["iteration_s"] for r in done])),
        "load_1min": float(np.median([r["load_1min"] for r in done])),
        "rounds": done,
    }  # fmt: skip


def fit_blocks(rows: list[dict], job: RealJob, key: str) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Per-block seconds t_i = c0 + c1 * GFLOPs_i (non-negative c0, c1) whose stage sums fit the
    rows' measured ``key`` (the slow-down divided out); the blocks, the stage fits' relative errors
    and (c0, c1)."""
    gflops = np.array([b.fwd_gflops for b in digits_blocks(job)])
    a, y = [], []
    for r in rows:
        b = bounds(r["sizes"])
        for s in range(len(r["sizes"])):
            a.append([b[s + 1] - b[s], gflops[b[s] : b[s + 1]].sum()])
            y.append(r[key][s] / r["slowdown"][s])
    a, y = np.array(a, dtype=np.float64), np.array(y)
    coef, _ = nnls(a, y)
    return coef[0] + coef[1] * gflops, (a @ coef - y) / y, coef.tolist()


def calibration_of(job: RealJob, blocks_f: np.ndarray, blocks_b: np.ndarray, link, pause: float) -> dict:
    return {
        "block_table": {"micro_batch": job.micro_batch, "forward_s": blocks_f.tolist(), "backward_s": blocks_b.tolist()},
        "link": {"bandwidth_bytes_per_s": float(link[0]), "latency_s": float(link[1])},
        "repartition_pause_s": float(pause),
    }  # fmt: skip


def predict(job: RealJob, cal: dict, row: dict) -> tuple[np.ndarray, float]:
    """The twin's per-stage compute (f + b per micro-batch) and iteration time of a measured plan."""
    twin = twin_simulator(job, "static_hetero", calibration=cal)
    n = twin.cluster.num_workers
    state = dict(slowdown=np.asarray(row["slowdown"]), alive=np.ones(n, bool), bandwidth_factor=1.0)
    cf, cb, *_ = twin.stage_times(tuple(row["sizes"]), row["micro_batches"], **state)
    return cf + cb, twin.expected_iteration_time_s(tuple(row["sizes"]), row["micro_batches"], **state)


def fit_link(job: RealJob, base: dict, rows: list[dict]) -> tuple[tuple[float, float], float]:
    """(bandwidth, latency) minimising the squared log error of the twin's iteration times."""

    def resid(p: np.ndarray) -> np.ndarray:
        cal = {**base, "link": {"bandwidth_bytes_per_s": 10.0 ** p[0], "latency_s": 10.0 ** p[1]}}
        return np.array([math.log(predict(job, cal, r)[1] / r["iteration_s"]) for r in rows])

    sol = least_squares(resid, x0=np.array([8.0, -3.5]), bounds=([5.0, -7.0], [11.0, -0.5]))
    return (10.0 ** sol.x[0], 10.0 ** sol.x[1]), float(np.sqrt(np.mean(sol.fun**2)))


def mdape(values: list[float]) -> float:
    return float(np.median(np.abs(values))) * 100.0 if values else float("nan")


def run(cfg: DictConfig) -> dict:
    job = RealJob(**plain(cfg.job))
    plans = [{**plain(p)} for p in cfg.calibrate] + [{**plain(p), "held_out": True} for p in cfg.held_out]
    load_before = os.getloadavg()
    out = Path(cfg.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    if cfg.get("refit_from"):  # the measurements of an earlier run, fitted again
        saved = json.loads((REPO_ROOT / cfg.refit_from).read_text())
        rows, pauses = saved["rows"], saved["pauses_s"]
    else:
        rows, pauses = measure_plans(job, plans, cfg)
        atomic_write_text(
            out, json.dumps({"rows": rows, "pauses_s": pauses, "partial": True}, indent=1) + "\n"
        )
    cal_rows = [r for r in rows if not r["held_out"]]
    f, f_err, f_coef = fit_blocks(cal_rows, job, "fwd_s")
    b, b_err, b_coef = fit_blocks(cal_rows, job, "bwd_s")
    pause = float(np.median(pauses))
    base = calibration_of(job, f, b, (1e9, 1e-4), pause)
    link, link_rms = fit_link(job, base, cal_rows)
    cal = calibration_of(job, f, b, link, pause)
    cal["fit"] = {
        "stage_forward_rel_error": f_err.tolist(), "stage_backward_rel_error": b_err.tolist(),
        "iteration_rms_log_error": link_rms, "pauses_s": pauses, "plans": len(cal_rows),
        "forward_s_per_block_and_per_gflop": f_coef, "backward_s_per_block_and_per_gflop": b_coef,
    }  # fmt: skip
    cal["job"] = plain(cfg.job)
    cal["generated_by"] = "python -m experiments.pipeline_fidelity"
    cal["machine"] = {"cpu_count": os.cpu_count(), "load_average_before": list(load_before),
                      "load_average_after": list(os.getloadavg())}  # fmt: skip
    twin_model(job, cal)  # the table must build a model
    cal_out = Path(cfg.calibration_out)
    cal_out = cal_out if cal_out.is_absolute() else REPO_ROOT / cal_out
    atomic_write_text(cal_out, json.dumps(cal, indent=1) + "\n")
    stage_err, iter_err = [], []
    for r in rows:
        stage, it = predict(job, cal, r)
        meas = np.array(r["fwd_s"]) + np.array(r["bwd_s"])
        r["predicted_stage_s"], r["predicted_iteration_s"] = stage.tolist(), float(it)
        r["stage_ape"] = (np.abs(stage - meas) / meas).tolist()
        r["iteration_ape"] = abs(it - r["iteration_s"]) / r["iteration_s"]
        if r["held_out"]:
            stage_err += r["stage_ape"]
            iter_err.append(r["iteration_ape"])
    result = {
        "held_out_stage_mdape_pct": mdape(stage_err),
        "held_out_iteration_mdape_pct": mdape(iter_err),
        "calibration_stage_mdape_pct": mdape([e for r in cal_rows for e in r["stage_ape"]]),
        "calibration_iteration_mdape_pct": mdape([r["iteration_ape"] for r in cal_rows]),
        "repartition_pause_s": pause,
        "pauses_s": pauses,
        "link": cal["link"],
        "rows": rows,
        "cluster": cpu_cluster().name,
        "config": plain(cfg),
        "machine": cal["machine"],
    }
    atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    log.info("held-out MdAPE: stage %.1f %%, iteration %.1f %% (calibration: %.1f %%, %.1f %%); pause %.1f s",
             result["held_out_stage_mdape_pct"], result["held_out_iteration_mdape_pct"],
             result["calibration_stage_mdape_pct"], result["calibration_iteration_mdape_pct"], pause)  # fmt: skip
    return result


main = hydra_app("pipeline_fidelity", run, "held_out_iteration_mdape_pct", __spec__)


if __name__ == "__main__":
    main()
