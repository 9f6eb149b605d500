"""PerWorkerEnv: the cluster seen by one shared policy, one worker at a time."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dynamix_gym.envs.hetero_cluster import DISCRETE_ACTION_MODES, HeteroClusterEnv


class PerWorkerEnv(gym.Env):
    """
    ## Description
    The per-worker form of :class:`HeteroClusterEnv` as a single Gymnasium env: a policy with
    shared parameters decides for each worker in turn from that worker's own features plus the
    cluster-wide features, so the same policy drives a cluster of any size. After the last
    worker's decision the cluster trains for one interval. (For training, :class:`PerWorkerVecEnv`
    presents every worker of several clusters as parallel sub-environments instead.)

    ## Action Space
    ``Discrete(len(action_set))``: the step for the worker whose turn it is: a batch delta
    (``action_mode="delta"``, default) or a batch factor (``"scale"``). :meth:`action_masks` gives
    that worker's legal steps (those that keep its batch within its [min, max]), as sb3-contrib's
    ``MaskablePPO`` reads them.

    ## Observation Space
    ``Box(-1, 1, (Fw + Fg,), float32)``: the worker's own features, then the global features of the
    env's observation schema (schema 1: 19 + 13 = 32, :data:`dynamix_gym.OBS_SCHEMA`; schema 2:
    14 + 15 = 29, :data:`dynamix_gym.obs.OBS_SCHEMA_V2`).

    ## Rewards
    The cluster's reward (see :class:`HeteroClusterEnv`) on the step that completes a round of
    decisions; 0 on the other turns.

    ## Starting State, Episode End, Arguments
    As :class:`HeteroClusterEnv` (every keyword is passed on; the action mode is ``delta`` or
    ``scale``).
    ``info["worker"]`` names the worker whose turn comes next; ``reset(options=...)`` takes the
    cluster env's options (``initial_batches``).

    ## Version History
    * v0: initial version (observation schema 1); ``obs_schema=2`` and ``action_mode="scale"``
      are opt-in (defaults unchanged).
    """

    metadata = {"render_modes": []}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        mode = kwargs.get("action_mode", "delta")
        if mode not in DISCRETE_ACTION_MODES:
            raise ValueError(
                f"PerWorkerEnv supports action_mode in {list(DISCRETE_ACTION_MODES)}, got {mode!r}"
            )
        self.cluster_env = HeteroClusterEnv(**{**kwargs, "action_mode": mode})
        self.num_workers = self.cluster_env.num_workers
        dim = self.cluster_env.obs_schema.per_worker_dim
        self.observation_space = spaces.Box(-1.0, 1.0, (dim,), np.float32)
        self.action_space = spaces.Discrete(self.cluster_env.action_set.size)
        self._turn = 0
        self._pending = np.zeros(self.num_workers, dtype=np.int64)
        self._rows: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        # The cluster env draws from this env's generator: one seed drives everything.
        _, info = self.cluster_env.reset(seed=int(self.np_random.integers(2**31 - 1)), options=options)
        self._rows = self.cluster_env.per_worker_observations()
        self._turn = 0
        return self._rows[0].copy(), {**info, "worker": 0}

    def step(self, action):
        if self._rows is None:
            raise RuntimeError("PerWorkerEnv.step() called before reset()")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is outside the action space {self.action_space}")
        self._pending[self._turn] = int(action)
        self._turn += 1
        if self._turn < self.num_workers:
            return self._rows[self._turn].copy(), 0.0, False, False, {"worker": self._turn}
        _, reward, terminated, truncated, info = self.cluster_env.step(self._pending.copy())
        self._rows = self.cluster_env.per_worker_observations()
        self._turn = 0
        return self._rows[0].copy(), reward, terminated, truncated, {**info, "worker": 0}

    def action_masks(self) -> np.ndarray:
        """(len(action_set),) bool: the legal steps of the worker whose turn it is."""
        if self._rows is None:
            raise RuntimeError("PerWorkerEnv.action_masks() called before reset()")
        return self.cluster_env.action_mask_matrix()[self._turn]

    def close(self) -> None:
        self.cluster_env.close()
