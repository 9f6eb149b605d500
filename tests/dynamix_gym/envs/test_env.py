"""The Gymnasium env: registration, checkers, determinism, properties, bad input."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from gymnasium.utils.env_checker import data_equivalence
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import dynamix_gym
from dynamix_gym import OBS_SCHEMA, HeteroClusterEnv, PerWorkerEnv

ENV_ID = "dynamix/HeteroCluster-v0"


def test_registered_defaults_build_the_default_heterogeneous_scenario():
    env = gym.make(ENV_ID)
    inner = env.unwrapped
    assert isinstance(inner, HeteroClusterEnv)
    assert inner.backend.spec.gpu_types == ("T4",) * 4 + ("V100",) * 4
    assert inner.backend.sim.scenario.name == "static_hetero"
    assert env.observation_space.shape == (OBS_SCHEMA.centralised_dim(8),)
    assert env.action_space == gym.spaces.MultiDiscrete([5] * 8)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert set(info) >= {"report", "local_batches", "reward_terms"}


def test_module_prefixed_id_and_workers_argument():
    env = gym.make("dynamix_gym:dynamix/HeteroCluster-v0", workers=12)
    assert env.unwrapped.num_workers == 12
    assert env.unwrapped.backend.spec.gpu_types.count("T4") == 6


def test_schema_is_exported_and_matches_encoder_output():
    assert dynamix_gym.OBS_SCHEMA.worker_dim == len(OBS_SCHEMA.worker_features)
    env = HeteroClusterEnv(workers=4)
    env.reset(seed=1)
    assert env.per_worker_observations().shape == (4, OBS_SCHEMA.per_worker_dim)
    assert len(OBS_SCHEMA.centralised_names(4)) == env.observation_space.shape[0]
    assert "| 0 | self.net_throughput |" in OBS_SCHEMA.as_table()


@pytest.mark.parametrize(
    "make",
    [
        lambda: HeteroClusterEnv(workers=4, scenario="mixed"),
        lambda: HeteroClusterEnv(workers=4, action_mode="continuous"),
        lambda: PerWorkerEnv(workers=4, scenario="mixed"),
    ],
    ids=["centralised", "continuous", "per-worker"],
)
def test_gymnasium_and_sb3_checkers_pass_without_warnings(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(make(), skip_render_check=True)
        sb3_check_env(make(), warn=True)


def rollout(env: gym.Env, seed: int, steps: int) -> list:
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    out = [obs]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        out.append((obs, reward, terminated, truncated, info["local_batches"], info["reward_terms"]))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append(obs)
    return out


@pytest.mark.parametrize("scenario", ["static_hetero", "mixed"])
def test_same_seed_same_rollout(scenario):
    a = rollout(gym.make(ENV_ID, workers=6, scenario=scenario), 123, 200)
    b = rollout(gym.make(ENV_ID, workers=6, scenario=scenario), 123, 200)
    c = rollout(gym.make(ENV_ID, workers=6, scenario=scenario), 124, 200)
    assert data_equivalence(a, b)
    assert not data_equivalence(a, c)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.integers(1, 12),
    scenario=st.sampled_from(["static_hetero", "throttle", "jitter", "interference", "mixed"]),
    mode=st.sampled_from(["delta", "absolute", "continuous"]),
    reward=st.sampled_from(["dynamix", "time"]),
    interval=st.integers(1, 100),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_configs_and_actions_stay_finite_and_in_bounds(
    workers, scenario, mode, reward, interval, seed
):
    env = HeteroClusterEnv(
        workers=workers,
        scenario=scenario,
        action_mode=mode,
        reward=reward,
        interval=interval,
        max_decisions=150,
    )
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    spec = env.backend.spec
    for _ in range(150):
        obs, reward_value, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert np.isfinite(reward_value)
        b = info["local_batches"]
        assert np.all((b >= spec.min_batch) & (b <= spec.max_batch))
        assert all(np.isfinite(v) for v in info["reward_terms"].values())
        if terminated or truncated:
            obs, _ = env.reset()


def test_long_random_rollout_thousands_of_steps():
    env = HeteroClusterEnv(workers=8, scenario="mixed", interval=20)
    obs, _ = env.reset(seed=7)
    env.action_space.seed(7)
    episodes = 0
    for _ in range(3000):
        obs, r, term, trunc, _info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and np.isfinite(r)
        if term or trunc:
            episodes += 1
            env.reset()
    assert episodes >= 1


def test_clipping_is_reported():
    env = HeteroClusterEnv(workers=2, initial_batch=32)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([0, 4]))  # -100 from 32 is below the minimum of 16
    assert info["clipped"] == [{"worker": 0, "requested": -68, "applied": 16}]
    assert info["local_batches"].tolist() == [16, 132]


def test_absolute_and_continuous_modes_apply_targets():
    env = HeteroClusterEnv(workers=2, action_mode="absolute")
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([100.4, 700.0], dtype=np.float32))
    assert info["local_batches"].tolist() == [100, 700]
    env = HeteroClusterEnv(workers=2, action_mode="continuous", initial_batch=100)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([1.0, -1.0], dtype=np.float32))
    assert info["local_batches"].tolist() == [120, 80]


def test_time_reward_sums_to_minus_wall_time_plus_bonus():
    env = HeteroClusterEnv(workers=8, reward="time", interval=100)
    _, info = env.reset(seed=0)
    total, t0 = 0.0, info["wall_time_s"]
    while True:
        _, r, term, trunc, info = env.step(np.full(8, 2))
        total += r
        if term or trunc:
            break
    cfg = env.reward_config
    expected = -(info["wall_time_s"] - t0) / cfg.time_scale_s + (cfg.target_bonus if term else 0.0)
    assert total == pytest.approx(expected, rel=1e-9)


def test_dynamix_reward_terms_are_reported_separately():
    env = HeteroClusterEnv(workers=4)
    env.reset(seed=0)
    _, r, _, _, info = env.step(np.full(4, 2))
    terms = info["reward_terms"]
    assert set(terms) == {"accuracy", "accuracy_gain", "iteration_time", "batch_regulariser", "stability"}
    assert r == pytest.approx(sum(terms.values()))
    assert terms["batch_regulariser"] < 0  # batch 128 is two doublings away from 32


def test_episode_terminates_at_target_accuracy():
    env = HeteroClusterEnv(workers=8, interval=100)
    env.reset(seed=3)
    for _ in range(5000):
        _, _, term, trunc, info = env.step(np.full(8, 2))
        if term or trunc:
            break
    assert term and not trunc
    assert info["val_accuracy"] >= env.backend.spec.target_accuracy
    assert info["time_to_accuracy_s"] == info["wall_time_s"]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.full(8, 2))


def test_truncates_at_decision_budget():
    env = HeteroClusterEnv(workers=4, max_decisions=3)
    env.reset(seed=0)
    flags = [env.step(np.full(4, 2))[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scenario": "volcano"}, "unknown scenario 'volcano'"),
        ({"cluster": "moon"}, "unknown cluster 'moon'"),
        ({"workload": "mnist-on-abacus"}, "unknown workload"),
        ({"action_mode": "telepathy"}, "unknown action_mode"),
        ({"interval": 0}, "interval"),
        ({"action_set": (5,)}, "action_set"),
    ],
)
def test_bad_configuration_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HeteroClusterEnv(**kwargs)


def test_bad_actions_and_step_before_reset():
    env = HeteroClusterEnv(workers=4)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(4, dtype=np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        env.step(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="outside the action space"):
        env.step(np.array([0, 1, 2, 5]))
    with pytest.raises(ValueError, match="outside the action space"):
        env.step(np.array([0, 1, 2, -1]))
    absolute = HeteroClusterEnv(workers=2, action_mode="absolute")
    absolute.reset(seed=0)
    with pytest.raises(ValueError, match="outside the action space"):
        absolute.step(np.array([8.0, 100.0], dtype=np.float32))
    per_worker = PerWorkerEnv(workers=2)
    with pytest.raises(RuntimeError, match="before reset"):
        per_worker.step(0)


def test_world_time_scale_makes_the_teachers_return_near_minus_one_in_every_world():
    """RandomizedClusterEnv(time_scale="world"): each world's time reward is scaled by the time the
    best global batch held from the first interval would take (from the simulator's truth), so the
    time-to-target oracle's undiscounted time penalty is near -1 on an NCF world of seconds and on
    a CIFAR-10 one of minutes alike; the fixed scale's differ by orders of magnitude."""
    from dynamix_gym.controllers.registry import make_controller
    from dynamix_gym.envs.randomized import RandomizedClusterEnv
    from dynamix_gym.learning.imitation import expert_steps

    returns = {}
    for workload in ("ncf", "cifar10"):
        for scale in ("fixed", "world"):
            env = RandomizedClusterEnv(
                domain={"workers": 4, "workloads": [workload], "scenarios": ["static_hetero"]},
                time_scale=scale,
                reward={"kind": "time", "target_bonus": 0.0},
                obs_schema=3,
                action_mode="scale",
                action_set=[0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 16.0, 64.0],
            )
            obs, info = env.reset(seed=3)
            assert ("time_scale_s" in info) == (scale == "world")
            teacher = make_controller("oracle", objective="time_to_target", batch_penalty=0.0)
            teacher.reset(env.backend.spec)
            total, done = 0.0, False
            while not done:
                target, _ = teacher.predict(obs, info)
                steps = expert_steps(
                    "scale",
                    env.batches,
                    np.asarray(target, float),
                    env.action_set,
                    0.1,
                    env.action_mask_matrix(),
                )
                obs, r, term, trunc, info = env.step(steps)
                total, done = total + r, term or trunc
            assert term
            returns[workload, scale] = total
    for workload in ("ncf", "cifar10"):
        assert -1.6 < returns[workload, "world"] < -0.8, returns
    assert returns["cifar10", "fixed"] / returns["ncf", "fixed"] > 5.0, returns


def test_world_time_scale_needs_the_time_reward():
    from dynamix_gym.envs.randomized import RandomizedClusterEnv

    with pytest.raises(ValueError, match=r"env\.time_scale='world' scales the 'time' reward"):
        RandomizedClusterEnv(domain={"workers": 2}, time_scale="world", reward="dynamix")
    with pytest.raises(ValueError, match=r"env\.time_scale"):
        RandomizedClusterEnv(domain={"workers": 2}, time_scale="minutes", reward="time")


def test_a_fixed_domain_cluster_is_every_episodes_cluster():
    from dynamix_gym.envs.randomized import DomainRandomization
    from sim.cluster import mixed_cluster

    cluster = mixed_cluster({"A100": 2, "T4": 2})
    dom = DomainRandomization(workers=4, cluster=cluster, workloads=("ncf",))
    rng = np.random.default_rng(0)
    assert all(dom.sample(rng)["cluster"] is cluster for _ in range(5))
    with pytest.raises(ValueError, match=r"domain\.workers is 8 but domain\.cluster has 4 workers"):
        DomainRandomization(workers=8, cluster=cluster)
    with pytest.raises(ValueError, match=r"domain\.cluster must be a sim\.cluster\.ClusterSpec"):
        DomainRandomization(workers=4, cluster="a100_t4")
