"""PerWorkerVecEnv: every worker of several clusters as one sub-environment of an SB3 VecEnv.

This is parameter sharing in the manner of SuperSuit's PettingZoo-to-SB3 conversion: each worker
is a sample of one shared policy (its own features plus the cluster-wide ones) and receives its
cluster's reward. The policy never sees the cluster size in its input shape, so a policy trained on
4-worker clusters drives 8, 16 or 32 workers unchanged.

Each cluster runs in its own single-env SB3 VecEnv: ``DummyVecEnv`` (in-process, the default) or
``SubprocVecEnv`` (one process per cluster). Clusters may differ in size; they share one
observation schema, one discrete action mode (``delta`` or ``scale``) and one action set.
``env_method("action_masks")`` (what sb3-contrib's ``MaskablePPO`` calls) answers each worker's
row of its cluster's mask, so masked PPO trains on the per-worker form as it does on one env.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

from dynamix_gym.envs.hetero_cluster import DISCRETE_ACTION_MODES, HeteroClusterEnv
from dynamix_gym.learning.central_critic import critic_state_dim, with_critic_state
from dynamix_gym.obs import get_schema


class PerWorkerVecEnv(VecEnv):
    """Sub-environment ``j`` is worker ``j - offsets[c]`` of cluster ``c``.

    Args:
        env_fns: callables building :class:`HeteroClusterEnv` instances (``delta`` or ``scale``
            action mode).
        sizes: the number of workers each callable's cluster has (needed up front when clusters
            live in subprocesses; inferred in-process when omitted).
        subprocess: run each cluster in its own process (``SubprocVecEnv``).
        critic_state: append the cluster's state (the mean, min and max over its workers of each
            per-worker feature, :func:`~dynamix_gym.learning.central_critic.with_critic_state`) to
            every row, for a centralised critic; the actor of such a policy reads the row alone.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        sizes: Sequence[int] | None = None,
        subprocess: bool = False,
        critic_state: bool = False,
    ) -> None:
        if not env_fns:
            raise ValueError("PerWorkerVecEnv needs at least one cluster env")
        if subprocess:
            if sizes is None:
                raise ValueError("sizes must be given when clusters run in subprocesses")
            self.clusters: list[VecEnv] = [SubprocVecEnv([fn], start_method="spawn") for fn in env_fns]
        else:
            self.clusters = [DummyVecEnv([fn]) for fn in env_fns]
            for c in self.clusters:
                inner = c.envs[0].unwrapped
                if not isinstance(inner, HeteroClusterEnv) or inner.action_mode not in DISCRETE_ACTION_MODES:
                    raise ValueError(
                        f"PerWorkerVecEnv needs HeteroClusterEnv instances in action_mode in "
                        f"{list(DISCRETE_ACTION_MODES)}"
                    )
            sizes = [c.envs[0].unwrapped.num_workers for c in self.clusters]
        self.sizes = [int(s) for s in sizes]
        if len(self.sizes) != len(self.clusters):
            raise ValueError(f"got {len(self.clusters)} env_fns but {len(self.sizes)} sizes")
        versions = {c.get_attr("obs_schema")[0].version for c in self.clusters}
        if len(versions) != 1:
            raise ValueError(f"all clusters must encode one observation schema, got {sorted(versions)}")
        #: the observation schema every cluster encodes (its per-worker rows are the sub-envs' obs)
        self.schema = get_schema(versions.pop())
        for c, n in zip(self.clusters, self.sizes, strict=True):
            expected = self.schema.centralised_dim(n)
            if c.observation_space.shape != (expected,):
                raise ValueError(
                    f"a cluster declared with {n} workers has observation shape {c.observation_space.shape}, "
                    f"expected ({expected},)"
                )
            if not isinstance(c.action_space, spaces.MultiDiscrete):
                raise ValueError(
                    f"PerWorkerVecEnv needs clusters in action_mode in {list(DISCRETE_ACTION_MODES)} "
                    "(MultiDiscrete actions)"
                )
        n_actions = {int(c.action_space.nvec[0]) for c in self.clusters}
        if len(n_actions) != 1:
            raise ValueError(f"all clusters must share one action set, got sizes {sorted(n_actions)}")
        modes = {c.get_attr("action_mode")[0] for c in self.clusters}
        sets = {tuple(np.asarray(c.get_attr("action_set")[0]).tolist()) for c in self.clusters}
        if len(modes) != 1 or len(sets) != 1:
            raise ValueError(
                f"all clusters must share one action mode and set, got modes {sorted(modes)} and sets "
                f"{sorted(sets)}"
            )
        self.action_mode = modes.pop()
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes))).astype(int)
        self.critic_state = bool(critic_state)
        dim = self.schema.per_worker_dim
        if self.critic_state:
            dim += critic_state_dim(self.schema.worker_dim)
        obs_space = spaces.Box(-1.0, 1.0, (dim,), np.float32)
        super().__init__(int(self.offsets[-1]), obs_space, spaces.Discrete(n_actions.pop()))
        self.actions: np.ndarray | None = None

    # --- VecEnv API -------------------------------------------------------------------------------
    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        for c, cluster in enumerate(self.clusters):
            cluster.seed(seed + c)
        return [seed + c for c in range(len(self.clusters)) for _ in range(self.sizes[c])]

    def reset(self):
        obs = np.empty((self.num_envs, *self.observation_space.shape), dtype=np.float32)
        for c, cluster in enumerate(self.clusters):
            lo, hi = self.offsets[c], self.offsets[c + 1]
            obs[lo:hi] = self._rows(cluster.reset()[0], self.sizes[c])
            for j in range(lo, hi):
                self.reset_infos[j] = {"cluster": c, "worker": j - lo}
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions).reshape(self.num_envs)
        for c, cluster in enumerate(self.clusters):
            cluster.step_async(self.actions[None, self.offsets[c] : self.offsets[c + 1]])

    def step_wait(self) -> VecEnvStepReturn:
        obs = np.empty((self.num_envs, *self.observation_space.shape), dtype=np.float32)
        rewards = np.empty(self.num_envs, dtype=np.float32)
        dones = np.empty(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = []
        for c, cluster in enumerate(self.clusters):
            lo, hi, n = self.offsets[c], self.offsets[c + 1], self.sizes[c]
            c_obs, c_rew, c_done, c_infos = cluster.step_wait()
            info = c_infos[0]
            obs[lo:hi] = self._rows(c_obs[0], n)
            rewards[lo:hi] = c_rew[0]
            dones[lo:hi] = c_done[0]
            truncated = bool(info.get("TimeLimit.truncated", False))
            terminal = self._rows(info["terminal_observation"], n) if c_done[0] else None
            for w in range(n):
                row = {"cluster": c, "worker": w, "TimeLimit.truncated": truncated}
                if w == 0:  # the cluster's own info once, on its first worker
                    row["cluster_info"] = info
                if terminal is not None:
                    row["terminal_observation"] = terminal[w]
                infos.append(row)
        return obs, rewards, dones, infos

    def close(self) -> None:
        for cluster in self.clusters:
            cluster.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [
            self.clusters[self._cluster_index(i)].get_attr(attr_name)[0] for i in self._get_indices(indices)
        ]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for c in sorted({self._cluster_index(i) for i in self._get_indices(indices)}):
            self.clusters[c].set_attr(attr_name, value)

    def has_attr(self, attr_name: str) -> bool:
        return all(c.has_attr(attr_name) for c in self.clusters)

    def action_masks(self) -> np.ndarray:
        """(num_envs, len(action_set)) bool: each sub-env's (worker's) legal steps."""
        return np.concatenate([c.env_method("action_mask_matrix")[0] for c in self.clusters])

    def env_method(
        self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs
    ) -> list[Any]:
        if method_name == "action_masks":  # a worker's own row, not its cluster's flat mask
            masks = self.action_masks()
            return [masks[i] for i in self._get_indices(indices)]
        return [
            self.clusters[self._cluster_index(i)].env_method(method_name, *method_args, **method_kwargs)[0]
            for i in self._get_indices(indices)
        ]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return [
            self.clusters[self._cluster_index(i)].env_is_wrapped(wrapper_class)[0]
            for i in self._get_indices(indices)
        ]

    def get_images(self):
        return [None for _ in range(self.num_envs)]

    def _rows(self, obs: np.ndarray, n: int) -> np.ndarray:
        rows = self.schema.split_centralised(obs, n)
        if self.critic_state:
            rows = with_critic_state(rows, self.schema.worker_dim)
        return rows

    def _cluster_index(self, i: int) -> int:
        return int(np.searchsorted(self.offsets, i, side="right") - 1)
