"""The smallest local batch comes from the workload or the workers' memory caps, never a constant
that exceeds a cap."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from support import ROOT

from sim.cluster import homogeneous_cluster
from sim.engine import Simulator
from sim.hardware import compute_table
from sim.workloads import DEFAULT_MIN_LOCAL_BATCH, WORKLOADS, get_workload


def test_bert_preset_runs_with_the_defaults():
    sim = Simulator("t4v100", "bert", seed=0)
    assert sim.min_batch.tolist() == [WORKLOADS["bert"].min_local_batch] * sim.num_workers
    assert sim.max_batch.min() < DEFAULT_MIN_LOCAL_BATCH  # the T4 cap of 12
    sim.reset()
    report = sim.run_interval(sim.max_batch, 5)
    assert report.global_batch == int(sim.max_batch.sum())


@pytest.mark.parametrize("name", sorted(set(WORKLOADS) - {"bert"}))
def test_shipped_workloads_keep_the_default_minimum(name):
    assert Simulator("t4v100", name).min_batch_value == DEFAULT_MIN_LOCAL_BATCH


def test_without_a_workload_minimum_the_smallest_cap_bounds_the_default():
    wl = get_workload("bert", min_local_batch=None)
    sim = Simulator(homogeneous_cluster("T4", 2), wl)
    assert sim.min_batch_value == int(sim.max_batch.min()) == 12


def test_a_minimum_above_a_cap_names_the_allowed_range():
    with pytest.raises(ValueError, match=r"min_batch \(16\) exceeds the memory cap.*allowed: \[1, 12\]"):
        Simulator("t4v100", "bert", min_batch=16)


@pytest.mark.integration
def test_evaluate_app_runs_workload_bert_with_its_defaults(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "workload=bert", "env.max_decisions=2",
         f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["workload"].tolist() == ["bert"]
    assert summary["decisions"].tolist() == [2]
    # The table shows SQuAD F1 in percent; the env sees it as the quality F1 / 100.
    assert summary["metric"].tolist() == ["f1"] and summary["target_metric"].tolist() == [88.0]
    assert summary["target_accuracy"].tolist() == [0.88]
    assert summary["final_metric"].iloc[0] == pytest.approx(100.0 * summary["final_accuracy"].iloc[0])


def test_every_fitted_application_has_a_preset_that_runs_with_the_defaults():
    apps = {app for (_, app) in compute_table()}
    assert apps <= {w.app for w in WORKLOADS.values()}
    for wl in WORKLOADS.values():
        sim = Simulator("t4v100", wl, seed=0)
        assert np.all(sim.min_batch <= sim.max_batch), wl.name
        sim.reset()
        sim.run_interval(sim.min_batch, 2)
