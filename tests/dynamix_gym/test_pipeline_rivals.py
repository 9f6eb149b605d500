"""Pipeline rivals: PipeDream's DP against brute force, DynPipe's S choice and trigger, the limit."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import (
    DynPipeController,
    EvenSplitController,
    PipeDreamController,
    TruthReplanController,
)
from dynamix_gym.pipeline.evaluation import hindsight_limit, run_pipeline_episode
from dynamix_gym.pipeline.forest import StagePredictor
from dynamix_gym.pipeline.planner import dynpipe_plan, pipedream_partition, plan_cost_s, profile
from sim.cluster import default_cluster, homogeneous_cluster
from sim.faults import FaultWindow, Scenario
from sim.pipeline.model import ModelShape, generate_model
from sim.pipeline.partition import even_split
from sim.pipeline.simulator import PipelineSimulator

QUIET = Scenario("quiet", compute_noise_cv=0.0, measurement_noise_cv=0.0)


@pytest.mark.parametrize("seed", range(4))
def test_pipedream_dp_matches_brute_force(seed):
    model = generate_model(np.random.default_rng(seed), ModelShape(num_blocks=(9, 11)))
    sim = PipelineSimulator(default_cluster(4), model, QUIET)
    p, n = profile(sim), model.num_blocks
    dp = pipedream_partition(p, 8)
    best = min(plan_cost_s(p, np.diff((0, *c, n))) for c in itertools.combinations(range(1, n), 3))
    assert plan_cost_s(p, dp) == pytest.approx(best)
    assert plan_cost_s(p, dp) <= plan_cost_s(p, even_split(n, 4))


def test_planned_partition_is_faster_on_a_mixed_cluster():
    model = generate_model(np.random.default_rng(7), ModelShape(num_blocks=(24, 24)))
    sim = PipelineSimulator(default_cluster(4), model, QUIET)
    sim.reset(seed=0)
    dp = pipedream_partition(profile(sim), 8)
    assert sim.expected_iteration_time_s(dp, 8) < 0.8 * sim.expected_iteration_time_s(even_split(24, 4), 8)


def test_slowdown_moves_blocks_off_the_slow_stage():
    model = generate_model(np.random.default_rng(1), ModelShape(num_blocks=(16, 16), unevenness=(0.0, 0.0)))
    p = profile(PipelineSimulator(homogeneous_cluster("V100", 4), model, QUIET))
    quiet = pipedream_partition(p, 8)
    slowed = pipedream_partition(p, 8, slowdown=[1.0, 3.0, 1.0, 1.0])
    assert slowed[1] < quiet[1]


def test_dynpipe_stage_count_trades_speed_against_staleness():
    model = generate_model(np.random.default_rng(2), ModelShape(num_blocks=(32, 32)))

    def chosen(kappa):
        def make(s):
            return PipelineSimulator(homogeneous_cluster("V100", 8), model, QUIET, stages=s,
                                     schedule="async_1f1b", staleness_kappa=kappa)  # fmt: skip

        S, _, scores = dynpipe_plan(make, 8, 32, 8, 8)
        assert scores[S] == min(scores.values())
        return S

    assert chosen(0.0) >= chosen(1.0)  # a heavy staleness penalty never asks for more stages
    assert chosen(1.0) == 1 or chosen(1.0) < 8


def test_infeasible_memory_is_a_clear_error():
    model = generate_model(np.random.default_rng(0), ModelShape(num_blocks=(8, 8)))
    sim = PipelineSimulator(homogeneous_cluster("V100", 2), model, QUIET, memory_gib=[1e-4, 1e-4])
    with pytest.raises(ValueError, match="no partition"):
        pipedream_partition(profile(sim), 8)


class _Oracle:
    """A stand-in forest: the stage's measured forward time over the profile's (feature 0)."""

    def predict(self, x):
        return np.maximum(2.0 ** x[:, 0], 1.0)


def test_dynpipe_repartitions_after_a_sustained_slowdown_then_cools_down():
    model = generate_model(np.random.default_rng(3), ModelShape(num_blocks=(16, 16), unevenness=(0.0, 0.0)))
    window = FaultWindow("throttle", start_s=200.0, duration_s=1e6, worker=1, factor=0.4)
    env = PipelineClusterEnv(homogeneous_cluster("V100", 4), model, dataclasses.replace(QUIET, windows=(window,)),
                             interval=5000, interval_s=20.0, target_quality=0.99, max_decisions=80)  # fmt: skip
    ctrl = DynPipeController(StagePredictor(_Oracle(), {}), sustain_s=30.0, cooldown_s=300.0)
    _, info = env.reset(seed=0, options=ctrl.start_options(env, 0))
    ctrl.reset(env)
    moved_at = []
    for _ in range(80):
        action, _ = ctrl.predict(None, info)
        prev = env.sizes
        _, _, _, _, info = env.step(action)
        if info["sizes"] != prev:
            moved_at.append(info["report"].wall_time_s)
    assert moved_at and moved_at[0] > 200.0 + 30.0  # not before the throttle has held for the window
    assert env.sizes[1] < 4  # blocks moved off the throttled stage
    assert ctrl.repartitions == 1  # the slowdown stays: one re-partition, no thrashing


@pytest.mark.parametrize("relative", [False, True])
def test_relative_dynpipe_ignores_a_load_that_slows_every_stage_alike(relative):
    """Every worker at 0.5x speed (a loaded machine against a quiet profile): the absolute trigger
    sees every stage slowed and re-plans on the uniform slow-down; the relative one sees none."""
    model = generate_model(np.random.default_rng(3), ModelShape(num_blocks=(16, 16), unevenness=(0.0, 0.0)))
    windows = tuple(FaultWindow("throttle", 0.0, 1e6, worker=w, factor=0.5) for w in range(4))
    env = PipelineClusterEnv(homogeneous_cluster("V100", 4), model, dataclasses.replace(QUIET, windows=windows),
                             interval=5000, interval_s=20.0, target_quality=0.99, max_decisions=20)  # fmt: skip
    ctrl = DynPipeController(StagePredictor(_Oracle(), {}), sustain_s=0.0, cooldown_s=0.0, relative=relative)
    _, info = env.reset(seed=0, options=ctrl.start_options(env, 0))
    ctrl.reset(env)
    for _ in range(5):
        action, _ = ctrl.predict(None, info)
        _, _, _, _, info = env.step(action)
    assert ctrl.applied == (frozenset() if relative else frozenset(range(4)))


def test_hindsight_limit_is_never_beaten_by_its_rivals():
    from dynamix_gym.pipeline.worlds import task_seeds, world_fn

    env = PipelineClusterEnv(world=world_fn("test", "interference"), interval=100, max_decisions=300)
    rivals = [EvenSplitController(), PipeDreamController()]
    for seed in task_seeds("test", 2):
        lim = hindsight_limit(env, seed, rivals)
        for c in [*rivals, TruthReplanController(0.1)]:
            assert lim["time_to_target_s"] <= run_pipeline_episode(env, c, seed)["time_to_target_s"]
        assert math.isfinite(lim["time_to_target_s"])


def test_stage_features_read_a_throttle_off_the_counters():
    from dynamix_gym.pipeline.forest import StageFeatures

    model = generate_model(np.random.default_rng(4), ModelShape(num_blocks=(12, 12)))
    window = FaultWindow("throttle", start_s=0.0, duration_s=1e6, worker=2, factor=0.5)
    sim = PipelineSimulator(
        homogeneous_cluster("V100", 4), model, dataclasses.replace(QUIET, windows=(window,))
    )
    sim.reset(seed=0)
    feats = StageFeatures(profile(sim))
    x = feats.update(sim.run_interval(even_split(12, 4), 8, 3))
    np.testing.assert_allclose(x[:, 0], [0.0, 0.0, 1.0, 0.0], atol=1e-9)  # log2 of the slow-down


def test_shipped_forest_drives_dynpipe_through_an_episode():
    from dynamix_gym.pipeline.worlds import task_seeds, world_fn

    env = PipelineClusterEnv(world=world_fn("test", "interference"), interval=100, max_decisions=40)
    row = run_pipeline_episode(env, DynPipeController(), task_seeds("test", 1)[0])
    assert row["decisions"] > 0 and row["controller"] == "dynpipe"
