"""Adapter pieces that need no worker processes: spaces, sampling, learning-rate rules, faults."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from support import ROOT

import dynamix_gym  # noqa: F401  (registers the envs)
from adapters.faults import FaultEmulator
from adapters.sampling import GlobalBatchSchedule, loss_weight, rank_slice
from sim.faults import FaultWindow, Scenario
from sim.hardware import ComputeModel, compute_params
from sim.protocol import IntervalReport
from sim.scaling import lr_gain


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_real_env_spaces_equal_the_simulated_envs(workers):
    real = gym.make("dynamix/RealDDP-v0", workers=workers)
    sim = gym.make("dynamix/HeteroCluster-v0", workers=workers)
    try:
        assert real.observation_space == sim.observation_space
        assert real.action_space == sim.action_space
        assert real.unwrapped.backend.worker_pids == []  # no process before reset
    finally:
        real.close()
        sim.close()


def test_real_env_absolute_mode_space_follows_the_backend_limits():
    env = gym.make("dynamix/RealDDP-v0", workers=2, action_mode="absolute", min_batch=8, max_batch=(64, 256))
    assert env.action_space.shape == (2,)
    assert env.action_space.high.tolist() == [64.0, 256.0]
    assert env.unwrapped.backend.spec.deterministic is False


def test_emulated_cluster_sets_workers_and_gpu_types():
    from adapters.ddp_env import make_real_ddp_env
    from sim.cluster import mixed_cluster

    env = make_real_ddp_env(cluster=mixed_cluster({"T4": 1, "V100": 1}), emulate="cluster")
    assert env.unwrapped.backend.spec.gpu_types == ("T4", "V100")
    with pytest.raises(ValueError, match="GPUs to emulate"):
        make_real_ddp_env(cluster=mixed_cluster({"T4": 1, "V100": 1}), emulate="cluster", workers=3)


def test_schedule_slices_partition_each_global_batch_across_epochs():
    n, batches = 50, [7, 0, 13]
    sched = GlobalBatchSchedule(n, seed=3)
    seen = []
    for _ in range(10):  # 200 samples: four epochs, crossing epoch boundaries mid-batch
        idx = sched.next_global(sum(batches))
        parts = [idx[rank_slice(batches, r)] for r in range(3)]
        assert [len(p) for p in parts] == batches
        assert np.array_equal(np.concatenate(parts), idx)
        seen.append(idx)
    flat = np.concatenate(seen)
    for e in range(4):  # each epoch is a permutation of the training set
        assert sorted(flat[e * n : (e + 1) * n].tolist()) == list(range(n))
    assert sched.epochs_done == pytest.approx(4.0)
    again = GlobalBatchSchedule(n, seed=3)
    again.load_state_dict(sched.state_dict())
    assert np.array_equal(again.next_global(9), sched.next_global(9))


def test_loss_weight_makes_the_average_the_global_mean():
    b = [5, 17, 40]
    assert loss_weight(b) == pytest.approx(3 / 62)
    with pytest.raises(ValueError):
        loss_weight([0, 0])


def test_lr_rules_match_the_simulator_semantics():
    assert lr_gain("linear", 256, 32, None) == pytest.approx(8.0)
    assert lr_gain("sqrt", 128, 32, None) == pytest.approx(2.0)
    assert lr_gain("none", 512, 32, 100.0) == 1.0
    assert lr_gain("adascale", 256, 32, None) == 1.0  # no estimate yet: the base learning rate
    # AdaScale: (M/M0) (B + M0) / (B + M), between 1 and M / M0, -> M/M0 for a huge noise scale.
    g = lr_gain("adascale", 256, 32, 200.0)
    assert g == pytest.approx(8 * 232 / 456)
    assert 1.0 <= g <= 8.0
    assert lr_gain("adascale", 256, 32, 1e9) == pytest.approx(8.0, rel=1e-6)
    with pytest.raises(ValueError, match="lr_rule"):
        lr_gain("cubic", 64, 32, None)


def test_fault_emulator_turns_scenarios_into_slowdowns():
    sc = Scenario(
        name="t",
        worker_speed=(1.0, 0.25),
        windows=(FaultWindow("throttle", start_s=10.0, duration_s=5.0, worker=0, factor=0.5),),
    )
    fe = FaultEmulator(sc, 2, ("cpu", "cpu"))
    fe.reset(seed=0)
    f = fe.interval(0.0, np.array([32, 32]), 5, comm_s=0.0)
    assert f.slowdown.tolist() == [1.0, 4.0]
    f = fe.interval(11.0, np.array([32, 32]), 5, comm_s=0.0)  # throttled worker 0: 2x slower
    assert f.slowdown.tolist() == [1.0, 2.0]
    assert any("throttle start on worker 0" in e for e in f.events)
    # Within an interval: the changes ahead, drawn from the same seeds, in seconds after its start.
    fe.reset(seed=0)
    ahead = fe.interval(4.0, np.array([32, 32]), 5, comm_s=0.0).slowdown_changes
    assert [(t, s.tolist()) for t, s in ahead] == [(6.0, [1.0, 2.0]), (11.0, [1.0, 4.0])]
    during = fe.interval(12.0, np.array([32, 32]), 5, comm_s=0.0)
    assert during.slowdown.tolist() == [1.0, 2.0]
    assert [(t, s.tolist()) for t, s in during.slowdown_changes] == [(3.0, [1.0, 4.0])]
    assert fe.interval(20.0, np.array([32, 32]), 5, comm_s=0.0).slowdown_changes == ()
    # Emulated GPU types: each rank is as much slower than the fastest as the fitted compute
    # models say at its local batch.
    fe = FaultEmulator(None, 2, ("T4", "V100"), emulate=("T4", "V100"))
    fe.reset(seed=0)
    b = np.array([512, 64])
    s = fe.interval(0.0, b, 3, comm_s=0.0).slowdown
    models = [ComputeModel(compute_params(g, "cifar10")) for g in ("T4", "V100")]
    t = np.array([[float(m.compute_time_s(x)) for m in models] for x in b])  # (rank's batch, type)
    assert np.allclose(s, [t[0, 0] / t[0].min(), t[1, 1] / t[1].min()])
    assert s[0] > 2.0  # a T4 at 512 is well over twice as slow as a V100 (host-bound below ~128)


def test_fault_emulator_network_delay_is_shared_and_scales_with_congestion():
    sc = Scenario(name="n", windows=(FaultWindow("congestion", start_s=0.0, duration_s=100.0, factor=0.25),))
    fe = FaultEmulator(sc, 2, ("cpu", "cpu"))
    fe.reset(seed=1)
    f = fe.interval(1.0, np.array([8, 8]), 4, comm_s=0.01)
    assert f.net_delay_s.shape == (4,)
    assert np.allclose(f.net_delay_s, 0.01 * (1 / 0.25 - 1))
    assert math.isfinite(float(f.net_delay_s.sum()))


def test_overhead_summary_ratio_and_bootstrap_interval():
    from adapters.bench import summarise

    rng = np.random.default_rng(0)
    plain = rng.uniform(0.7, 0.9, 40)
    rows = [(tp, tp * 1.03, 0.01, tp) for tp in plain]  # controller exactly 3% slower every round
    out = summarise(rows)
    assert out["ratio_total"] == pytest.approx(1.03)
    assert out["ratio_median"] == pytest.approx(1.03)
    low, high = out["ratio_total_ci95"]
    assert low == pytest.approx(1.03) and high == pytest.approx(1.03)
    noisy = [(tp, tp * rng.uniform(0.9, 1.2), 0.01, tp) for tp in plain]
    low, high = summarise(noisy)["ratio_total_ci95"]
    total = summarise(noisy)["ratio_total"]
    assert low < total < high and high - low > 0.02
    assert summarise(noisy) == summarise(noisy)  # seeded resampling


def test_reports_from_rank_timings_derive_idle_comm_and_zero_dead_ranks():
    # Two timed iterations of three ranks; rank 2 is down (its timings are ignored).
    compute = np.array([[0.10, 0.30], [0.20, 0.10], [9.0, 9.0]])
    wait = np.array([[0.05, 0.02], [0.04, 0.03], [0.0, 0.0]])
    alive = np.array([True, True, False])
    n = 3
    report = IntervalReport.from_rank_timings(
        local_batch=np.array([32, 64, 16]),
        alive=alive,
        compute_s=compute,
        wait_s=wait,
        iteration_time_s=np.array([0.4, 0.4, 0.0]),
        iterations=10,
        interval_time_s=4.0,
        rank_samples=np.array([320.0, 640.0, 0.0]),
        correct=np.array([160.0, 320.0, 0.0]),
        loss_sum=np.array([32.0, 64.0, 0.0]),
        grad_norm_mean=np.array([1.0, 2.0, 3.0]),
        grad_norm_var=np.array([0.1, 0.2, 0.3]),
        local_grad_sqr=np.array([1.0, 4.0, 9.0]),
        net_bytes_per_s=np.zeros(n),
        tcp_retransmissions=np.zeros(n),
        cpu_util=np.full(n, 0.5),
        mem_util=np.full(n, 0.5),
        gpu_util=np.full(n, 0.5),
        gpu_mem_util=np.zeros(n),
        wall_time_s=4.0,
        reconfig_time_s=0.0,
        global_grad_sqr=1.0,
        val_accuracy=0.5,
        val_loss=1.0,
        epoch=0.1,
    )
    report.validate()
    assert np.allclose(report.compute_time_s[:2], [0.2, 0.15])
    assert np.allclose(report.idle_time_s, [0.05, 0.1, 0.0])  # the slowest live rank sets the pace
    assert report.comm_time_s == pytest.approx(0.03)  # min over live ranks, mean over iterations
    assert report.global_batch == 96 and report.samples == 960
    assert np.allclose(report.samples_per_s, [80.0, 160.0, 0.0])
    assert np.allclose(report.batch_accuracy, [0.5, 0.5, 0.0]) and report.batch_loss[1] == 0.1
    assert report.grad_norm_mean[2] == report.local_grad_sqr[2] == 0.0 and report.truth is None


def test_the_real_backend_config_lists_the_guards_defaults():
    from dataclasses import asdict

    from omegaconf import OmegaConf

    from sim.guards import GuardConfig

    listed = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "backend" / "real.yaml"))["guards"]
    assert listed == asdict(GuardConfig())
