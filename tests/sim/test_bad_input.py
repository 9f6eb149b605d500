"""Bad input fails early with a message naming the field and the allowed range."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cluster import NodeSpec, default_cluster, get_cluster, mixed_cluster
from sim.engine import Simulator
from sim.faults import (
    FaultWindow,
    InterferenceSpec,
    NetworkSpec,
    Scenario,
    SlowdownSpec,
    ThrottleSpec,
    get_scenario,
)
from sim.hardware import compute_params
from sim.workloads import get_workload


@pytest.fixture
def sim() -> Simulator:
    s = Simulator("t4v100", "cifar10", "static_hetero", seed=0)
    s.reset()
    return s


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: NodeSpec(gpu="H900", gpus=4), r"unknown node gpu type 'H900'; choose one of \['A100'"),
        (lambda: mixed_cluster({"TPU": 2}), r"unknown gpu type 'TPU'"),
        (lambda: compute_params("P100", "cifar10"), r"unknown gpu type .*'P100'.*'T4'"),
        (lambda: compute_params("T4", "gpt5"), r"unknown application for T4 .*'gpt5'"),
        (lambda: get_workload("mnist"), r"unknown workload 'mnist'; choose one of \['bert', 'cifar10'"),
        (lambda: get_scenario("volcano"), r"unknown scenario 'volcano'"),
        (lambda: get_cluster("moon"), r"unknown cluster 'moon'"),
        (lambda: default_cluster(0), r"workers must be in \[1, 4096\], got 0"),
        (lambda: NodeSpec(gpu="T4", gpus=0), r"gpus on a T4 node must be in \[1, 64\], got 0"),
    ],
)
def test_unknown_names_and_bad_specs(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    ("batches", "match"),
    [
        (
            np.array([0, 128, 128, 128, 128, 128, 128, 128]),
            r"local_batches\[0\] = 0 is outside worker 0's allowed range \[16, 1024\]",
        ),
        (np.array([-5] + [128] * 7), r"local_batches\[0\] = -5 is outside"),
        (
            np.array([128] * 7 + [4000]),
            r"local_batches\[7\] = 4000 is outside worker 7's allowed range \[16, 3072\] \(V100\)",
        ),
        (np.full(7, 128), r"local_batches must have shape \(8,\), got \(7,\)"),
        (np.full(8, 128.5), "whole numbers"),
        (np.array([np.nan] * 8), "whole numbers"),
    ],
)
def test_bad_batches(sim, batches, match):
    with pytest.raises(ValueError, match=match):
        sim.run_interval(batches, 10)


@pytest.mark.parametrize("k", [0, -3])
def test_iterations_below_one(sim, k):
    with pytest.raises(ValueError, match=r"iterations \(K\) must be in \[1, 1e\+06\]"):
        sim.run_interval(np.full(8, 128), k)


def test_run_before_reset():
    with pytest.raises(RuntimeError, match="reset"):
        Simulator().run_interval(np.full(8, 128), 10)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        # bandwidth: non-positive factors
        (
            lambda: NetworkSpec(congestion_bandwidth_factor=(0.0, 0.5)),
            r"network.congestion_bandwidth_factor\[0\] must be in \[0.001, 1\], got 0.0",
        ),
        (
            lambda: FaultWindow("congestion", 10.0, 5.0, factor=0.0),
            r"window.factor \(congestion\) must be in \(0, 1\]",
        ),
        (
            lambda: FaultWindow("throttle", 10.0, 5.0, factor=-0.5),
            r"window.factor \(throttle\) must be in \(0, 1\]",
        ),
        # min > max
        (
            lambda: ThrottleSpec(duration_s=(300.0, 60.0)),
            r"throttle.duration_s\[0\] \(300.0\) must not exceed throttle.duration_s\[1\] \(60.0\)",
        ),
        (
            lambda: InterferenceSpec(gpu_slowdown=(3.0, 1.5)),
            r"interference.gpu_slowdown\[0\] \(3.0\) must not exceed",
        ),
        # probabilities outside [0, 1]
        (lambda: SlowdownSpec(probability=1.5), r"slowdown.probability must be in \[0, 1\], got 1.5"),
        (
            lambda: InterferenceSpec(worker_probability=-0.1),
            r"interference.worker_probability must be in \[0, 1\]",
        ),
        (lambda: NetworkSpec(loss_rate=2.0), r"network.loss_rate must be in \[0, 1\], got 2.0"),
        # other ranges
        (lambda: ThrottleSpec(rate_per_hour=-1.0), r"throttle.rate_per_hour must be in \[0, 3600\]"),
        (
            lambda: Scenario(name="x", worker_speed=(1.0, 0.0)),
            r"scenario.worker_speed\[1\] must be in \(0, 10\]",
        ),
        (lambda: Scenario(name="x", compute_noise_cv=-0.1), r"scenario.compute_noise_cv must be in \[0, 1\]"),
        (lambda: FaultWindow("meteor", 1.0, 1.0), r"unknown fault window kind 'meteor'"),
    ],
)
def test_bad_fault_specs(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_scenario_that_does_not_fit_the_cluster():
    sc = Scenario(name="x", windows=(FaultWindow("throttle", 1.0, 1.0, worker=12),))
    with pytest.raises(ValueError, match=r"fault window worker=12 must be in \[0, 7\]"):
        Simulator("t4v100", "cifar10", sc)
    with pytest.raises(ValueError, match="worker_speed has 2 entries, the cluster has 8 workers"):
        Simulator("t4v100", "cifar10", Scenario(name="y", worker_speed=(1.0, 1.0)))


def test_simulator_arguments():
    with pytest.raises(ValueError, match=r"min_batch \(2000\) exceeds the memory cap"):
        Simulator("t4v100", "cifar10", "static_hetero", min_batch=2000)
    with pytest.raises(ValueError, match=r"reconfig_delay_s must be in \[0, 3600\]"):
        Simulator(reconfig_delay_s=-1.0)
    with pytest.raises(ValueError, match="unknown lr_rule"):
        Simulator(lr_rule="cosine")
