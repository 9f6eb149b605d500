"""dynamix/PipelineCluster-v1 (and v0): both checkers, masks that guarantee valid plans, same seed same run."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import dynamix_gym  # noqa: F401  (registers the ids)
from dynamix_gym.envs.pipeline_cluster import (
    GLOBAL_FEATURES,
    MOVE_FEATURES,
    STAGE_FEATURES,
    PipelineClusterEnv,
)
from sim.cluster import homogeneous_cluster
from sim.faults import FaultWindow, Scenario
from sim.pipeline.model import uniform_model


@pytest.mark.parametrize("version", ["v0", "v1"])
def test_checkers_pass(version):
    env = gym.make(f"dynamix/PipelineCluster-{version}").unwrapped
    check_env(env, skip_render_check=True)
    sb3_check_env(env)


def test_versions_differ_by_the_move_gains_only():
    v0 = gym.make("dynamix/PipelineCluster-v0", interval=10).unwrapped
    v1 = gym.make("dynamix/PipelineCluster-v1", interval=10).unwrapped
    o0, _ = v0.reset(seed=3)
    o1, _ = v1.reset(seed=3)
    extra = (v1.max_stages - 1) * len(MOVE_FEATURES)
    assert o1.shape[0] == o0.shape[0] + extra
    np.testing.assert_array_equal(o1[: o0.shape[0]], o0)


def test_move_gains_point_off_a_throttled_stage():
    """4 V100 stages of 4 uniform blocks, worker 1 at 0.4x speed: a move that takes a block off
    stage 1 (boundary 0 by +1, boundary 1 by -1) shortens the slowest stage, one that hands it a
    block lengthens it, the other boundary's moves change nothing; padding boundaries read -1."""
    quiet = Scenario("quiet", compute_noise_cv=0.0, measurement_noise_cv=0.0)
    window = FaultWindow("throttle", start_s=0.0, duration_s=1e6, worker=1, factor=0.4)
    env = PipelineClusterEnv(homogeneous_cluster("V100", 4), uniform_model(16),
                             dataclasses.replace(quiet, windows=(window,)), stages=4, interval=20)  # fmt: skip
    env.reset(seed=0, options={"sizes": (4, 4, 4, 4)})
    _, _, _, _, info = env.step(env.action_for(env.sizes))
    g = env.move_gain_values(info["report"])
    assert g[0, 1] > 0.1 and g[1, 0] > 0.1  # stage 0 takes stage 1's first block; stage 1 hands on its last
    assert g[0, 0] < 0 and g[1, 1] < 0  # stage 1 receiving a block: its cost grows
    assert g[2, 0] == pytest.approx(0.0, abs=1e-9)  # stages 2 and 3 are not the bottleneck
    assert np.all(g[3:] == -1)  # padding boundaries
    obs = env._obs(info["report"])
    assert env.observation_space.contains(obs)


def test_docstring_table_names_every_feature():
    doc = PipelineClusterEnv.__doc__
    for name in STAGE_FEATURES + GLOBAL_FEATURES + MOVE_FEATURES:
        assert f"| {name} |" in doc, name


def random_masked(env, rng):
    m = env.action_mask_matrix()
    k = len(env.micro_batch_set)
    return [rng.choice(np.flatnonzero(m[i, :3])) for i in range(env.max_stages - 1)] + [
        rng.choice(np.flatnonzero(m[-1, :k]))
    ]


def test_any_unmasked_action_gives_a_valid_plan():
    # tight memory: the masks must keep every stage non-empty and under its cap
    env = PipelineClusterEnv(
        "t4v100_4", uniform_model(8), "static_hetero", interval=2, simulator_kwargs={"memory_gib": [0.06] * 4}
    )
    rng = np.random.default_rng(0)
    env.reset(seed=1, options={"micro_batches": 4})
    for _ in range(300):
        obs, _, term, trunc, info = env.step(random_masked(env, rng))
        assert info["refused"] == []
        assert min(info["sizes"]) >= 1 and sum(info["sizes"]) == 8
        assert env.observation_space.contains(obs)
        if term or trunc:
            env.reset(seed=2, options={"micro_batches": 4})


def test_masked_entry_is_refused_and_listed():
    env = PipelineClusterEnv("t4v100_4", uniform_model(4), "static_hetero", interval=2)
    env.reset(seed=0)  # sizes (1, 1, 1, 1): no boundary can take a block from a one-block stage
    a = np.ones(8, dtype=int)
    a[0] = 2
    _, _, _, _, info = env.step(a)
    assert info["refused"] == [(0, 2)] and info["sizes"] == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="element of"):
        env.step(np.full(8, 5))


def test_action_for_moves_toward_a_plan():
    env = PipelineClusterEnv("t4v100_4", uniform_model(16), "static_hetero", interval=2)
    env.reset(seed=0)
    for _ in range(4):  # boundary 2 moves 8 -> 12: four steps of one block
        _, _, _, _, info = env.step(env.action_for((7, 5, 2, 2)))
    assert info["sizes"] == (7, 5, 2, 2)


def test_same_seed_same_rollout():
    def run(seed):
        env = gym.make("dynamix/PipelineCluster-v1", interval=10)
        env.reset(seed=seed)
        rng = np.random.default_rng(0)
        out = []
        for _ in range(20):
            obs, r, *_ = env.step(random_masked(env.unwrapped, rng))
            out.append((obs.copy(), r))
        return out

    a, b = run(3), run(3)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    assert any(x[1] != y[1] for x, y in zip(a, run(4), strict=True))


def test_reward_is_minus_the_interval_time():
    env = PipelineClusterEnv(interval=5)
    env.reset(seed=0)
    _, r, _, _, info = env.step(env.action_for(env.sizes))
    assert r == pytest.approx(-info["report"].interval_time_s / 60.0)
    with pytest.raises(ValueError, match=r"reward\.kind"):
        PipelineClusterEnv(reward="dynamix")
