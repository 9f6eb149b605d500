"""dynamix/PipelineCluster-v0: both checkers, masks that guarantee valid plans, same seed same run."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import dynamix_gym  # noqa: F401  (registers the ids)
from dynamix_gym.envs.pipeline_cluster import GLOBAL_FEATURES, STAGE_FEATURES, PipelineClusterEnv
from sim.pipeline.model import uniform_model


def test_checkers_pass():
    env = gym.make("dynamix/PipelineCluster-v0").unwrapped
    check_env(env, skip_render_check=True)
    sb3_check_env(env)


def test_docstring_table_names_every_feature():
    doc = PipelineClusterEnv.__doc__
    for name in STAGE_FEATURES + GLOBAL_FEATURES:
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
        env = gym.make("dynamix/PipelineCluster-v0", interval=10)
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
