"""dynamix/RealPipeline-v1: the pipeline env's own code over live CPU gloo stage ranks."""

from __future__ import annotations

import multiprocessing

import gymnasium as gym
import numpy as np
import pytest

from adapters.real_pipeline.backend import RealPipelineBackend
from adapters.real_pipeline.env import RealPipelineEnv
from adapters.real_pipeline.twin import RealJob, burst_scenario, load_calibration, twin_simulator
from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import EvenSplitController
from dynamix_gym.pipeline.planner import pipedream_partition, profile
from sim.faults import FaultWindow, Scenario

#: A made-up calibration: these tests check the plumbing, not the fit.
CAL = {
    "block_table": {"micro_batch": 4, "forward_s": [1e-4] * 8, "backward_s": [2e-4] * 8},
    "link": {"bandwidth_bytes_per_s": 1e8, "latency_s": 1e-4},
    "repartition_pause_s": 5.0,
}
SMALL = RealJob(hidden=32, memory_mib=46.0)


def test_spaces_are_the_simulated_envs():
    real = RealPipelineEnv(job=SMALL, calibration=CAL)
    sim = PipelineClusterEnv()
    assert real.observation_space == sim.observation_space
    assert real.action_space == sim.action_space
    assert real.sim is None  # nothing runs before reset


def test_shipped_calibration_builds_the_twin():
    cal = load_calibration()
    twin = twin_simulator(RealJob(), "static_hetero", calibration=cal)
    assert twin.num_stages == 2 and twin.model.num_blocks == 8
    with pytest.raises(ValueError, match="fits the memory caps"):  # the whole model needs two ranks
        pipedream_partition(
            profile(twin_simulator(RealJob(), "static_hetero", calibration=cal, stages=1)), 16
        )


def test_a_scenario_that_removes_a_worker_is_refused():
    lose = Scenario("lose", windows=(FaultWindow("loss", 1.0, 5.0, 1),))
    with pytest.raises(ValueError, match="slow-downs only"):
        RealPipelineBackend(twin_simulator(SMALL, lose, calibration=CAL), SMALL)


def test_burst_scenario_checks_its_factor():
    with pytest.raises(ValueError, match="interference slow-down"):
        burst_scenario(factor=0.5)


@pytest.mark.integration
def test_one_interval_on_real_ranks_speaks_the_envs_protocol():
    env = gym.make(
        "dynamix/RealPipeline-v1", job=SMALL, calibration=CAL, interval=3, interval_s=None
    ).unwrapped
    try:
        ctrl = EvenSplitController()
        obs, info = env.reset(seed=3, options=ctrl.start_options(env, 3))
        ctrl.reset(env)
        assert env.observation_space.contains(obs)
        r = info["report"]
        assert r.sizes == (4, 4) and r.iterations == 3 and r.truth is None
        assert np.all(r.fwd_time_s > 0) and np.all(r.bwd_time_s > 0) and r.iteration_time_s > 0
        assert 0.0 <= r.val_accuracy <= 1.0 and r.samples == 3 * 16 * SMALL.micro_batch
        action, _ = ctrl.predict(obs, info)
        obs, reward, _, _, info = env.step(action)
        assert env.observation_space.contains(obs)
        assert info["report"].wall_time_s > r.wall_time_s and info["report"].repartition_time_s == 0.0
        assert reward == pytest.approx(
            -info["report"].interval_time_s / env.reward_cfg.time_scale_s, rel=1e-6
        )
    finally:
        env.close()
    assert multiprocessing.active_children() == []


@pytest.mark.integration
@pytest.mark.slow  # two rank starts and a re-partition (about 30 s on a loaded 2-core machine)
def test_a_boundary_move_restarts_the_ranks_and_loses_no_step():
    env = RealPipelineEnv(job=SMALL, calibration=CAL, interval=2, interval_s=None)
    try:
        env.reset(seed=1, options={"sizes": (4, 4), "micro_batches": 16})
        _, _, _, _, info = env.step(env.action_for((5, 3)))
        r = info["report"]
        assert r.sizes == (5, 3) and r.repartition_time_s > 0 and r.samples == 2 * 2 * 16 * SMALL.micro_batch
        assert env.sim.log[-1]["sizes"] == [5, 3]
    finally:
        env.close()
    assert multiprocessing.active_children() == []
