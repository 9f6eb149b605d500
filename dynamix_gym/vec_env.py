"""PerWorkerVecEnv: every worker of several clusters as one sub-environment of an SB3 VecEnv.

This is parameter sharing in the manner of SuperSuit's PettingZoo-to-SB3 conversion: each worker
is a sample of one shared policy (its own features plus the cluster-wide ones), and receives the
cluster's reward. Because the policy never sees the cluster size in its input shape, a policy
trained on 4-worker clusters drives 8, 16 or 32 workers unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.schema import OBS_SCHEMA


class PerWorkerVecEnv(VecEnv):
    """Sub-environment ``j`` is worker ``j - offset[c]`` of cluster env ``c``.

    Args:
        env_fns: callables building :class:`HeteroClusterEnv` instances in ``delta`` action mode.
            Their worker counts may differ; the number of sub-environments is their sum.
    """

    def __init__(self, env_fns: Sequence[Callable[[], HeteroClusterEnv]]) -> None:
        self.envs = [fn() for fn in env_fns]
        if not self.envs:
            raise ValueError("PerWorkerVecEnv needs at least one cluster env")
        for e in self.envs:
            if not isinstance(e.unwrapped, HeteroClusterEnv) or e.unwrapped.action_mode != "delta":
                raise ValueError("PerWorkerVecEnv needs HeteroClusterEnv instances in action_mode='delta'")
        sets = {tuple(e.unwrapped.action_set.tolist()) for e in self.envs}
        if len(sets) != 1:
            raise ValueError(f"all cluster envs must share one action set, got {sorted(sets)}")
        self.sizes = [e.unwrapped.num_workers for e in self.envs]
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes)))
        obs_space = spaces.Box(-1.0, 1.0, (OBS_SCHEMA.per_worker_dim,), np.float32)
        act_space = spaces.Discrete(len(next(iter(sets))))
        super().__init__(int(self.offsets[-1]), obs_space, act_space)
        self._cluster_seeds: list[int | None] = [None] * len(self.envs)
        self.actions: np.ndarray | None = None

    # --- VecEnv API -------------------------------------------------------------------------------
    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._cluster_seeds = [seed + c for c in range(len(self.envs))]
        return [seed + c for c in range(len(self.envs)) for _ in range(self.sizes[c])]

    def reset(self):
        obs = np.zeros((self.num_envs, *self.observation_space.shape), dtype=np.float32)
        for c, env in enumerate(self.envs):
            env.reset(seed=self._cluster_seeds[c])
            lo, hi = self.offsets[c], self.offsets[c + 1]
            obs[lo:hi] = env.unwrapped.per_worker_observations()
            for j in range(lo, hi):
                self.reset_infos[j] = {"cluster": c, "worker": j - lo}
        self._cluster_seeds = [None] * len(self.envs)
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions).reshape(self.num_envs)

    def step_wait(self) -> VecEnvStepReturn:
        obs = np.zeros((self.num_envs, *self.observation_space.shape), dtype=np.float32)
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        dones = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for c, env in enumerate(self.envs):
            lo, hi = self.offsets[c], self.offsets[c + 1]
            _, reward, terminated, truncated, info = env.step(self.actions[lo:hi])
            rows = env.unwrapped.per_worker_observations()
            done = terminated or truncated
            rewards[lo:hi] = reward
            dones[lo:hi] = done
            for j in range(lo, hi):
                w = j - lo
                infos[j] = {"cluster": c, "worker": w, "TimeLimit.truncated": truncated and not terminated}
                if w == 0:  # the cluster's own info once, on its first worker
                    infos[j]["cluster_info"] = info
            if done:
                for j in range(lo, hi):
                    infos[j]["terminal_observation"] = rows[j - lo].copy()
                env.reset()
                rows = env.unwrapped.per_worker_observations()
            obs[lo:hi] = rows
        return obs, rewards, dones, infos

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self._cluster_of(i), attr_name) for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for c in {self._cluster_index(i) for i in self._get_indices(indices)}:
            setattr(self.envs[c], attr_name, deepcopy(value))

    def env_method(
        self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs
    ) -> list[Any]:
        return [
            getattr(self._cluster_of(i), method_name)(*method_args, **method_kwargs)
            for i in self._get_indices(indices)
        ]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        from stable_baselines3.common import env_util

        return [env_util.is_wrapped(self._cluster_of(i), wrapper_class) for i in self._get_indices(indices)]

    def get_images(self):
        return [None for _ in range(self.num_envs)]

    # --- helpers ----------------------------------------------------------------------------------
    def _cluster_index(self, i: int) -> int:
        return int(np.searchsorted(self.offsets, i, side="right") - 1)

    def _cluster_of(self, i: int) -> gym.Env:
        return self.envs[self._cluster_index(i)]
