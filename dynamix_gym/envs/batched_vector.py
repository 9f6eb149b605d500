"""BatchedClusterVectorEnv: ``dynamix/HeteroCluster-v0`` as a native Gymnasium vector env."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from dynamix_gym.envs.batched_core import BatchedClusters, split_seeds


class BatchedClusterVectorEnv(VectorEnv):
    """
    ## Description
    ``num_envs`` copies of :class:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv` (or, with a
    ``domain``, of :class:`~dynamix_gym.envs.randomized.RandomizedClusterEnv`) stepped as one batch
    by :class:`sim.batched.BatchedSimulator`: what
    ``gymnasium.make_vec("dynamix/HeteroCluster-v0", num_envs=N, vectorization_mode="vector_entry_point")``
    builds. Sub-env ``i`` reset with seed ``s + i`` plays the episode ``HeteroClusterEnv`` plays
    with seed ``s + i``: the same world, faults and decisions; with ``noise="stream"`` the same
    numbers too (within floating-point rounding), with the default ``noise="batch"`` measurement
    and iteration noise of the same law drawn for the whole batch at once (the fast path).

    ## Action Space
    ``MultiDiscrete([len(action_set)] * N)`` per sub-env (``delta``, ``scale``) or ``Box(-1, 1,
    (N,))`` (``continuous``), batched. :meth:`action_masks` gives each sub-env's legal steps, flat
    as sb3-contrib's ``MaskablePPO`` reads them (``[num_envs, N * len(action_set)]``).

    ## Observation Space
    Schema 1 by default, ``Box(-1, 1, (N * 19 + 13,), float32)`` per sub-env (the table in
    :class:`HeteroClusterEnv`); ``obs_schema=2`` / ``3`` encode each cluster through its schema's
    own encoder (correct, not batched). Every world of a batch has the same worker count ``N``.

    ## Rewards, Starting State, Episode End
    As :class:`HeteroClusterEnv`. Sub-envs reset in the step that ends their episode (Gymnasium's
    ``SAME_STEP`` autoreset): ``infos["final_obs"]`` and ``infos["final_info"]`` (masked by
    ``infos["_final_obs"]``) hold the last observation and info of the finished episode, and the
    observation returned is the new episode's first; a domain draws the new world then.

    ## Arguments
    ``num_envs``, then :class:`HeteroClusterEnv`'s keywords (``cluster``, ``workload``,
    ``scenario``, ``workers``, ``initial_batch``, ``time_budget_s``, ``profile``, ``reward``,
    ``interval``, ``action_mode``, ``action_set``, ``max_decisions``, ``window``, ``sim_kwargs``,
    ``obs_schema``, ``split``, ``split_tolerance``), and: ``worlds`` (one mapping of world keywords per
    sub-env: scenarios, workloads and GPU mixes may differ within the batch), ``domain`` (a
    :class:`~dynamix_gym.envs.randomized.DomainRandomization`), ``noise`` (``"batch"`` or
    ``"stream"``), ``noise_seed``.

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        *,
        cluster: Any = None,
        workload: Any = None,
        scenario: Any = "static_hetero",
        workers: int | None = None,
        initial_batch: int | None = None,
        time_budget_s: float | None = None,
        profile: Any = None,
        worlds: Sequence[Mapping[str, Any]] | None = None,
        domain: Any = None,
        noise: str = "batch",
        noise_seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        world = {"cluster": cluster, "workload": workload, "scenario": scenario, "workers": workers,
                 "initial_batch": initial_batch, "time_budget_s": time_budget_s, "profile": profile}  # fmt: skip
        if domain is not None:
            world = None
        self.core = BatchedClusters(
            num_envs, world=world, worlds=worlds, domain=domain, noise=noise, noise_seed=noise_seed, **kwargs
        )
        core = self.core
        if len(set(core.sizes.tolist())) != 1:
            raise ValueError(
                f"every world of a BatchedClusterVectorEnv needs the same worker count (one observation "
                f"shape), got {sorted(set(core.sizes.tolist()))}; BatchedPerWorkerVecEnv takes mixed sizes"
            )
        self.num_envs = core.num_envs
        self.num_workers = n = core.width
        self.obs_schema = core.obs_schema
        self.single_observation_space = spaces.Box(
            -1.0, 1.0, (core.obs_schema.centralised_dim(n),), np.float32
        )
        if core.action_mode in ("delta", "scale"):
            self.single_action_space = spaces.MultiDiscrete(np.full(n, core.action_set.size, dtype=np.int64))
        else:
            self.single_action_space = spaces.Box(-1.0, 1.0, (n,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._started = False

    def _obs(self) -> np.ndarray:
        worker, glob = self.core.encoded()
        return np.concatenate([worker.reshape(len(worker), -1), glob], axis=1)

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; the batched env takes none")
        core = self.core
        rows = np.arange(self.num_envs)
        core.seed_rows(rows, split_seeds(seed, self.num_envs))
        report = core.start(rows)
        self._started = True
        return self._obs(), self._info(report)

    def _info(self, report) -> dict[str, Any]:
        return {"wall_time_s": report.wall_time_s, "val_accuracy": report.val_accuracy,
                "decisions": self.core.decisions[report.idx].copy()}  # fmt: skip

    def step(self, actions):
        if not self._started:
            raise RuntimeError("BatchedClusterVectorEnv.step() called before reset()")
        core = self.core
        report, reward, terminated, truncated = core.step(actions)
        obs = self._obs()
        info = self._info(report)
        done = terminated | truncated
        info["time_to_accuracy_s"] = np.where(terminated, report.wall_time_s, np.nan)
        info["_time_to_accuracy_s"] = terminated.copy()
        if done.any():
            rows = np.flatnonzero(done)
            info["final_obs"] = obs.copy()
            info["_final_obs"] = done.copy()
            info["final_info"] = {k: v.copy() for k, v in info.items() if not k.startswith("_")}
            info["_final_info"] = done.copy()
            core.seed_rows(rows, None)
            core.start(rows)
            obs[rows] = self._obs()
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """``[num_envs, N * len(action_set)]`` bool: each sub-env's legal steps, worker 0's first."""
        return self.core.masks().reshape(self.num_envs, -1)

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release: the clusters live in this process's arrays."""
