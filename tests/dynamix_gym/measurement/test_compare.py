"""Comparing a calibrated simulator with a real backend: scenario speeds over time, predicted
iteration times, time-to-accuracy tables, Kendall's tau and PPO's advantage, waiting for quiet."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dynamix_gym.measurement.compare import IterationPredictor, ppo_advantage, ranking, speeds_at, tta_table
from dynamix_gym.measurement.profiling import wait_for_quiet
from sim.cluster import ClusterSpec, ProfiledNodeSpec
from sim.faults import FaultWindow, Scenario
from sim.hardware import ComputeParams
from sim.network import CommParams
from sim.profile import write_profile
from sim.workloads import Workload

SCENARIO = Scenario(
    name="s",
    worker_speed=(0.4, 1.0),
    windows=(FaultWindow("throttle", start_s=2.0, duration_s=3.0, worker=0, factor=0.5),),
)


def test_speeds_follow_the_throttle_window():
    assert speeds_at(SCENARIO, 2, 0.0) == (0.4, 1.0)
    assert speeds_at(SCENARIO, 2, 2.0) == (0.2, 1.0)
    assert speeds_at(SCENARIO, 2, 4.99) == (0.2, 1.0)
    assert speeds_at(SCENARIO, 2, 5.0) == (0.4, 1.0)
    assert speeds_at(Scenario(name="none"), 3, 1.0) == (1.0, 1.0, 1.0)


def _profile(path, host_s: float):
    compute = ComputeParams(gpu="cpu-t", app="t", alpha_s=0.001, beta_s=1e-4, exponent=1.0, host_s=host_s, k=1.0,
                            max_batch=512)  # fmt: skip
    comm = CommParams(gpu="cpu-t", app="t", alpha_intra_s=0.002, beta_intra_s=0.0, alpha_inter_s=0.002,
                      beta_inter_s=0.0, gamma=1.0)  # fmt: skip
    wl = Workload(name="t", model="t", app="t", convergence="cifar10", params_millions=0.1, app_params_millions=0.1,
                  samples_per_epoch=1000, target_accuracy=0.9, num_classes=10, val_samples=100)  # fmt: skip
    cluster = ClusterSpec("c", (ProfiledNodeSpec(gpu="cpu-t", gpus=2, mem_gib=4.0),))
    return write_profile(path, name="c", cluster=cluster, workload=wl, computes=[compute], comms=[comm])


def test_iteration_predictor_slows_all_of_a_floor_free_compute_and_only_the_gpu_part_otherwise(tmp_path):
    b = np.array([64, 64])
    free = IterationPredictor(_profile(tmp_path / "free", host_s=0.0))
    full = free.compute_time_s(b, (1.0, 1.0))
    assert full[0] == pytest.approx(0.001 + 64e-4)
    assert free.compute_time_s(b, (0.5, 1.0)) == pytest.approx([2 * full[0], full[1]])
    # T_iter = (slowest compute) + T_sync with gamma = 1
    assert free.iteration_time_s(b, (0.5, 1.0)) == pytest.approx(2 * full[0] + 0.002)
    floor = IterationPredictor(_profile(tmp_path / "floor", host_s=0.004))
    f1, f2 = floor.compute_time_s(b, (1.0, 1.0))[0], floor.compute_time_s(b, (0.5, 1.0))[0]
    assert f2 < 2 * f1  # the host floor does not slow down


def _runs() -> pd.DataFrame:
    rows = []
    real = {"static-16": [4.0, 5.0], "static-64": [6.0, 7.0], "dlb": [2.0, 2.5], "ppo": [3.0, 3.5]}
    sim = {"static-16": [4.2, 4.4], "static-64": [6.5, 6.1], "dlb": [2.2, 2.0], "ppo": [3.1, 2.9]}
    for backend, table in (("real", real), ("sim", sim)):
        for ctrl, ttas in table.items():
            for seed, t in enumerate(ttas):
                rows.append({"controller": ctrl, "backend": backend, "seed": seed, "reached": True, "tta_s": t,
                             "total_time_s": t, "decision_time_ms": 1.0, "decisions": 5, "steps": 120})  # fmt: skip
    rows.append({"controller": "static-64", "backend": "real", "seed": 2, "reached": False, "tta_s": math.nan,
                 "total_time_s": 20.0, "decision_time_ms": 1.0, "decisions": 50, "steps": 1020})  # fmt: skip
    return pd.DataFrame(rows)


def test_tta_table_counts_a_missed_target_as_its_truncation_time():
    t = tta_table(_runs()).set_index(["controller", "backend"])
    assert t.loc[("static-64", "real"), "tta_mean_s"] == pytest.approx((6 + 7 + 20) / 3)
    assert t.loc[("static-64", "real"), "reached"] == 2 and t.loc[("static-64", "real"), "runs"] == 3
    assert t.loc[("dlb", "sim"), "tta_mean_s"] == pytest.approx(2.1)
    assert t.loc[("static-64", "real"), "tta_median_s"] == pytest.approx(7.0)
    # steps and seconds per step count only the runs that reached the target
    assert t.loc[("static-64", "real"), "steps_mean"] == 120
    assert t.loc[("static-64", "real"), "s_per_step"] == pytest.approx((6 / 120 + 7 / 120) / 2)


def test_ranking_and_ppo_advantage():
    runs = _runs()
    table = tta_table(runs)
    labels = ["static-16", "static-64", "dlb", "ppo"]
    r = ranking(table, runs, labels, seed=0)
    assert r["kendall_tau"] == pytest.approx(1.0)  # same order in both backends
    assert r["order_real"] == ["dlb", "ppo", "static-16", "static-64"] == r["order_sim"]
    lo, hi = r["kendall_tau_ci95"]
    assert -1.0 <= lo <= hi <= 1.0
    adv = ppo_advantage(table, ["static-16", "static-64"])
    assert adv["real"]["best_static"] == "static-16"
    assert adv["real"]["advantage_pct"] == pytest.approx(100 * (4.5 - 3.25) / 4.5)
    assert adv["sim"]["advantage_pct"] == pytest.approx(100 * (4.3 - 3.0) / 4.3)
    assert adv["gap_points"] == pytest.approx(abs(adv["sim"]["advantage_pct"] - adv["real"]["advantage_pct"]))
    assert ppo_advantage(table[table.controller != "ppo"], ["static-16"]) is None
    med = ranking(table, runs, labels, seed=0, stat="median")
    assert med["statistic"] == "median" and med["kendall_tau"] == pytest.approx(1.0)
    assert ppo_advantage(table, ["static-16", "static-64"], "median")["real"]["best_static"] == "static-16"


def test_wait_for_quiet_needs_a_quiet_minute_and_gives_up_at_its_limit():
    clock = {"t": 0.0}
    loads = iter([2.0, 0.5, 0.5, 1.2, 0.5, 0.5, 0.5, 0.5, 0.5])

    def sleep(s):
        clock["t"] += s

    res = wait_for_quiet(0.8, hold_s=60, poll_s=30, max_wait_s=1000, loadavg=lambda: (next(loads), 0, 0),
                         sleep=sleep, clock=lambda: clock["t"])  # fmt: skip
    assert res["quiet"] and res["waited_s"] == 180.0  # quiet from t=120 (after the spike at t=90) for 60 s
    res = wait_for_quiet(0.8, hold_s=60, poll_s=30, max_wait_s=100, loadavg=lambda: (3.0, 0, 0),
                         sleep=sleep, clock=lambda: clock["t"])  # fmt: skip
    assert not res["quiet"] and res["samples"][-1][1] == 3.0
