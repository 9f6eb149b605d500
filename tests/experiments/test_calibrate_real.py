"""End to end: ``python -m experiments.calibrate`` profiles two real CPU DDP ranks and writes a profile
the simulator runs on (a short ladder, a short curve per batch: well under a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from support import ROOT

from sim.engine import Simulator
from sim.fitting.table import read_profile_table
from sim.profile import load_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.mark.slow  # real DDP ranks: make test-slow
def test_calibrate_profiles_two_cpu_ranks_into_a_profile_the_simulator_runs(tmp_path):
    out = tmp_path / "cpu2"
    cmd = [
        sys.executable, "-m", "experiments.calibrate", f"out_dir={out}", "name=cpu2_test", "progress=false",
        "ladder.batches=[8,16,32,64,128]", "ladder.iterations=5", "ladder.repeats=2", "ladder.warmup_iterations=2",
        "overhead.intervals=8", "overhead.change_every=3",
        "curves.local_batches=[16,64]", "curves.seeds=[0]", "curves.progress=60", "curves.budget_s=40",
        "interval=5", "real.dataset=digits", "real.target_accuracy=0.9", "workload.name=digits_cnn",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=200, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]

    table = read_profile_table(out / "measurements.csv")
    assert set(table["num_gpus"]) == {1, 2}
    assert sorted(set(table["local_batch"])) == [8, 16, 32, 64, 128]
    assert (table.loc[table["num_gpus"] == 1, "sync_time_s"] == 0).all()

    prof = load_profile(out)
    assert prof.cluster.gpu_types == ("cpu", "cpu")
    assert prof.workload.app == "digits_cnn" and prof.workload.convergence == "digits_cnn"
    assert prof.workload.samples_per_epoch == 1438 and prof.workload.val_samples == 359
    assert "digits_cnn" in prof.convergence
    c = prof.compute[("cpu", "digits_cnn")]
    assert c.max_batch == 512  # the real backend's memory cap, beyond the measured ladder
    assert prof.simulator["min_batch"] == 8
    assert prof.simulator["interval_overhead_s"] >= 0 and prof.simulator["reconfig_delay_s"] >= 0
    meta = json.loads((out / "profile.json").read_text())
    assert meta["provenance"]["real_config"]["workers"] == 2
    assert len(meta["provenance"]["loadavg_start"]) == 3
    assert any("extrapolated above 128" in n for n in meta["calibration"]["notes"])

    curves = pd.read_csv(out / "curves.csv")
    assert set(curves["global_batch"]) == {32, 128}
    assert (curves.groupby("global_batch")["progress"].max() >= 60).all()

    md = (out / "calibration.md").read_text()
    assert "MdAPE per worker type: cpu" in md and "Convergence model from measured curves" in md

    sim = Simulator(profile=out)
    sim.reset(seed=0)
    report = sim.run_interval(np.array([16, 64]), 5)
    assert report.iteration_time_s[0] > 0 and 0.0 <= report.val_accuracy <= 1.0
