"""Stable-Baselines3 trains on the env, and one shared policy drives any cluster size."""

from __future__ import annotations

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from dynamix_gym import OBS_SCHEMA, HeteroClusterEnv
from dynamix_gym.envs.vec_env import PerWorkerVecEnv


def test_ppo_trains_on_per_worker_form_and_drives_a_larger_cluster():
    torch.manual_seed(0)
    vec = PerWorkerVecEnv([lambda: HeteroClusterEnv(workers=4, interval=50, reward="time") for _ in range(2)])
    assert vec.num_envs == 8
    vec.seed(0)
    model = PPO("MlpPolicy", VecMonitor(vec), n_steps=256, batch_size=256, n_epochs=2, seed=0, device="cpu")
    model.learn(total_timesteps=4096)
    assert model.num_timesteps >= 4096

    big = HeteroClusterEnv(workers=16, interval=50)
    big.reset(seed=1)
    before = big.batches.copy()
    for _ in range(5):
        rows = big.per_worker_observations()
        assert rows.shape == (16, OBS_SCHEMA.per_worker_dim)
        actions, _ = model.predict(rows, deterministic=True)
        _, _, _term, _trunc, info = big.step(actions)
        assert np.all(info["local_batches"] >= big.backend.spec.min_batch)
    assert big.batches.shape == before.shape == (16,)


def test_ppo_trains_on_centralised_form():
    env = DummyVecEnv([lambda: HeteroClusterEnv(workers=4, interval=50)])
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=256)
    obs = env.reset()
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == (1, 4)


def test_vec_env_broadcasts_cluster_reward_and_done():
    vec = PerWorkerVecEnv(
        [
            lambda: HeteroClusterEnv(workers=3, max_decisions=2),
            lambda: HeteroClusterEnv(workers=5, max_decisions=3),
        ]
    )
    vec.seed(5)
    obs = vec.reset()
    assert obs.shape == (8, OBS_SCHEMA.per_worker_dim)
    for step in range(3):
        obs, rewards, dones, infos = vec.step(np.full(8, 2))
        assert np.all(rewards[:3] == rewards[0]) and np.all(rewards[3:] == rewards[3])
        assert infos[0]["cluster_info"]["decisions"] in (1, 2)
        if step == 1:
            assert dones[:3].all() and not dones[3:].any()
            assert "terminal_observation" in infos[0]
    assert dones[3:].all()
