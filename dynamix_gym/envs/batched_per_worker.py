"""BatchedPerWorkerVecEnv: every worker of a batch of simulated clusters as one SB3 sub-env.

The per-worker form of :class:`~dynamix_gym.envs.vec_env.PerWorkerVecEnv` (parameter sharing: each
worker a sample of one shared policy, its own features plus the cluster-wide ones, its cluster's
reward) over :class:`~dynamix_gym.envs.batched_core.BatchedClusters` instead of one env per cluster:
the clusters (of any sizes: sub-env ``j`` is worker ``j - offsets[c]`` of cluster ``c``) step as one
batch. Cluster ``c`` reset with seed ``s + c`` plays the episode ``HeteroClusterEnv`` plays with that
seed, as in ``PerWorkerVecEnv`` (whose ``seed(s)`` seeds cluster ``c`` with ``s + c``).
``env_method("action_masks")`` and :meth:`action_masks` answer each worker's row of legal steps, so
sb3-contrib's ``MaskablePPO`` trains on it as on ``PerWorkerVecEnv``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

from dynamix_gym.envs.batched_core import BatchedClusters
from dynamix_gym.learning.central_critic import critic_state_dim, with_critic_state


class BatchedPerWorkerVecEnv(VecEnv):
    """Args:
    worlds: one mapping of world keywords per cluster (``cluster``, ``workload``, ``scenario``,
        ``workers`` ...: :data:`~dynamix_gym.envs.batched_core.WORLD_KEYS`); sizes may differ.
    domain: instead of ``worlds``, a :class:`~dynamix_gym.envs.randomized.DomainRandomization`
        drawn at every reset of each of ``num_clusters`` clusters (``domain_workers``: each
        cluster's worker count, e.g. the trainer's ``cluster_sizes`` repeated).
    critic_state: append the cluster's state to every row, as ``PerWorkerVecEnv`` does.
    **kwargs: :class:`BatchedClusters`' (``reward``, ``interval``, ``action_mode`` = ``delta`` or
        ``scale``, ``action_set``, ``max_decisions``, ``obs_schema``, ``split``, ``noise``,
        ``domain_workers``, ``sim_kwargs`` ...).
    """

    def __init__(
        self,
        worlds: Sequence[Mapping[str, Any]] | None = None,
        *,
        domain: Any = None,
        num_clusters: int | None = None,
        critic_state: bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("action_mode", "delta") not in ("delta", "scale"):
            raise ValueError(
                f"BatchedPerWorkerVecEnv needs action_mode 'delta' or 'scale', got {kwargs['action_mode']!r}"
            )
        if (worlds is None) == (domain is None):
            raise ValueError("give worlds (one mapping per cluster) or a domain with num_clusters")
        count = len(worlds) if worlds is not None else num_clusters
        if count is None:
            raise ValueError("num_clusters must be given with a domain")
        self.core = BatchedClusters(count, worlds=worlds, domain=domain, **kwargs)
        core = self.core
        if domain is not None and kwargs.get("domain_workers") is None and len(set(core.sizes.tolist())) != 1:
            raise ValueError("a domain must keep one worker count per cluster (or give domain_workers)")
        self.sizes = core.sizes.tolist()
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes))).astype(int)
        # (cluster, worker) of every sub-env, for gathering rows from the padded arrays
        self._cluster = np.repeat(np.arange(core.num_envs), self.sizes)
        self._worker = np.concatenate([np.arange(n) for n in self.sizes])
        self.schema = core.obs_schema
        self.critic_state = bool(critic_state)
        dim = self.schema.per_worker_dim + (critic_state_dim(self.schema.worker_dim) if critic_state else 0)
        super().__init__(
            int(self.offsets[-1]),
            spaces.Box(-1.0, 1.0, (dim,), np.float32),
            spaces.Discrete(core.action_set.size),
        )
        self.action_mode = core.action_mode
        self._cluster_seeds: list[int | None] | None = None
        self.actions: np.ndarray | None = None

    # --- rows ---------------------------------------------------------------------------------------
    def _rows(self, clusters: np.ndarray | None = None) -> np.ndarray:
        """Per-worker rows (own features, then the cluster's) of ``clusters`` (default: all, then
        the rows of the sub-envs in order)."""
        worker, glob = self.core.encoded()
        if clusters is None:
            c, w = self._cluster, self._worker
            rows = np.concatenate([worker[c, w], glob[c]], axis=1)
            if self.critic_state:
                rows = np.concatenate([with_critic_state(rows[lo:hi], self.schema.worker_dim)
                                       for lo, hi in zip(self.offsets[:-1], self.offsets[1:], strict=True)])  # fmt: skip
            return rows
        out = []
        for j, i in enumerate(clusters.tolist()):
            n = self.sizes[i]
            r = np.concatenate([worker[j, :n], np.broadcast_to(glob[j], (n, glob.shape[1]))], axis=1)
            out.append(with_critic_state(r, self.schema.worker_dim) if self.critic_state else r)
        return out

    # --- VecEnv API ---------------------------------------------------------------------------------
    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._cluster_seeds = [seed + c for c in range(self.core.num_envs)]
        return [seed + int(c) for c in self._cluster]

    def reset(self):
        core = self.core
        clusters = np.arange(core.num_envs)
        core.seed_rows(clusters, self._cluster_seeds)
        self._cluster_seeds = None
        core.start(clusters)
        for j in range(self.num_envs):
            self.reset_infos[j] = {"cluster": int(self._cluster[j]), "worker": int(self._worker[j])}
        self._reset_options()
        return self._rows().astype(np.float32)

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions).reshape(self.num_envs)

    def step_wait(self) -> VecEnvStepReturn:
        core = self.core
        per_cluster = np.zeros((core.num_envs, core.width), dtype=np.int64)
        per_cluster[self._cluster, self._worker] = self.actions
        report, reward, terminated, truncated = core.step(per_cluster)
        obs = self._rows().astype(np.float32)
        done = terminated | truncated
        rewards = reward[self._cluster].astype(np.float32)
        dones = done[self._cluster]
        infos: list[dict[str, Any]] = [
            {"cluster": int(c), "worker": int(w), "TimeLimit.truncated": bool(truncated[c])}
            for c, w in zip(self._cluster.tolist(), self._worker.tolist(), strict=True)
        ]
        if done.any():
            finished = np.flatnonzero(done)
            for c in finished.tolist():
                lo = self.offsets[c]
                infos[lo]["cluster_info"] = {
                    "wall_time_s": float(report.wall_time_s[c]),
                    "val_accuracy": float(report.val_accuracy[c]),
                    "terminated": bool(terminated[c]),
                }
                for w in range(self.sizes[c]):
                    infos[lo + w]["terminal_observation"] = obs[lo + w].copy()
            core.seed_rows(finished, None)
            core.start(finished)
            for c, rows in zip(finished.tolist(), self._rows(finished), strict=True):
                obs[self.offsets[c] : self.offsets[c + 1]] = rows
        return obs, rewards, dones, infos

    def action_masks(self) -> np.ndarray:
        """(num_envs, len(action_set)) bool: each sub-env's (worker's) legal steps."""
        return self.core.masks()[self._cluster, self._worker]

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        value = None if attr_name == "render_mode" else getattr(self.core, attr_name)  # nothing renders
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self.core, attr_name, value)

    def has_attr(self, attr_name: str) -> bool:
        return attr_name == "action_masks" or hasattr(self.core, attr_name)

    def env_method(
        self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs
    ) -> list[Any]:
        if method_name == "action_masks":
            masks = self.action_masks()
            return [masks[i] for i in self._get_indices(indices)]
        raise AttributeError(
            f"BatchedPerWorkerVecEnv has no per-env method {method_name!r} (only action_masks)"
        )

    def env_is_wrapped(self, wrapper_class, indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self):
        return [None for _ in range(self.num_envs)]
