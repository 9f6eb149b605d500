"""The clusters behind the batched vector envs: worlds, seeds, actions, episodes, resets.

:class:`BatchedClusters` holds ``num_envs`` simulated training runs in one
:class:`sim.batched.BatchedSimulator` and plays, for all of them at once, what
:class:`~dynamix_gym.envs.hetero_cluster.HeteroClusterEnv` (fixed worlds) or
:class:`~dynamix_gym.envs.randomized.RandomizedClusterEnv` (a ``domain``: a new world drawn at every
reset) plays for one: each cluster has its own generator, seeded as that env's would be (``seed +
i``), from which its world and its run's streams are drawn in the same order; actions become
batches by the same rule; the warm-up interval, the observation, the reward and the episode's end
are the same. Finished clusters are reset within the step (new worlds drawn without leaving the
batch) and run their warm-up interval together.

The vector envs are facades over it: :class:`~dynamix_gym.envs.batched_vector.BatchedClusterVectorEnv`
(Gymnasium) and :class:`~dynamix_gym.envs.batched_per_worker.BatchedPerWorkerVecEnv` (SB3, one
sub-env per worker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium.utils import seeding

from dynamix_gym.actions import (
    BALANCED_SPLITS,
    CONTINUOUS_SCALE,
    DEFAULT_SPLIT_TOLERANCE,
    check_action_set,
    check_split,
    observed_reconfig_s,
    split_batches,
)
from dynamix_gym.backends.sim_backend import SimBackend
from dynamix_gym.batched_encoding import BatchedEncoder, batched_reward
from dynamix_gym.obs import check_schema_version, get_schema, make_encoder
from dynamix_gym.reward import RewardConfig
from sim.batched import BatchedSimulator, BatchReport
from sim.batched_noise import batch_generator

#: What a cluster's world is built from (the keywords of :class:`SimBackend`).
WORLD_KEYS = ("cluster", "workload", "scenario", "workers", "initial_batch", "time_budget_s", "profile")


class BatchedClusters:
    """``num_envs`` clusters in one batched simulator, each an episode of the env it stands for.

    Args:
        num_envs: clusters in the batch.
        worlds: per cluster, a mapping of :data:`WORLD_KEYS` (default: one world from ``world``
            for every cluster); worlds may differ in everything, their worker counts too.
        world: the keywords of a world common to every cluster (overridden by ``worlds``' entries).
        domain: a :class:`~dynamix_gym.envs.randomized.DomainRandomization` (or a mapping of its
            fields): every reset draws the cluster's world from it (``worlds`` must then be None).
        domain_workers: with ``domain``, each cluster's worker count (its domain's ``workers``
            replaced), so that one batch holds clusters of several sizes (default: the domain's).
        sim_kwargs: passed to every :class:`SimBackend` (``reconfig_delay_s``, ``lr_rule`` ...).
        reward: as :class:`HeteroClusterEnv`.
        interval: as :class:`HeteroClusterEnv`.
        action_mode: as :class:`HeteroClusterEnv`.
        action_set: as :class:`HeteroClusterEnv`.
        max_decisions: as :class:`HeteroClusterEnv`.
        window: as :class:`HeteroClusterEnv`.
        obs_schema: as :class:`HeteroClusterEnv`.
        split: as :class:`HeteroClusterEnv` (``policy``, ``balanced`` or ``balanced_cost``): the
            balanced splits re-split each cluster's requested global batch over its last report by
            the env's own rule (:func:`dynamix_gym.actions.split_batches`), one cluster at a time.
        split_tolerance: as :class:`HeteroClusterEnv`.
        noise: ``"batch"`` (fast) or ``"stream"`` (each cluster's own noise stream: the per-cluster
            env's numbers), see :mod:`sim.batched_noise`.
        noise_seed: seeds the batch's noise stream (``noise="batch"``); default: the first reset's seed.
    """

    def __init__(
        self,
        num_envs: int,
        *,
        worlds: Sequence[Mapping[str, Any]] | None = None,
        world: Mapping[str, Any] | None = None,
        domain: Any = None,
        domain_workers: Sequence[int] | None = None,
        sim_kwargs: Mapping[str, Any] | None = None,
        reward: Any = "dynamix",
        interval: int = 50,
        action_mode: str = "delta",
        action_set: Sequence[float] | None = None,
        max_decisions: int | None = None,
        window: int = 4,
        obs_schema: int | str = 1,
        split: str = "policy",
        split_tolerance: float = DEFAULT_SPLIT_TOLERANCE,
        noise: str = "batch",
        noise_seed: int | None = None,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        if isinstance(interval, bool) or not isinstance(interval, int | np.integer) or interval < 1:
            raise ValueError(f"interval (K iterations per step) must be an integer >= 1, got {interval!r}")
        if max_decisions is not None and max_decisions < 1:
            raise ValueError(f"max_decisions must be >= 1 or None, got {max_decisions!r}")
        self.split, self.split_tolerance = check_split(split, split_tolerance)
        if action_mode not in ("delta", "scale", "continuous"):
            raise ValueError(
                f"action_mode {action_mode!r}: the batched envs take 'delta', 'scale' or 'continuous' "
                "(absolute actions have per-world bounds)"
            )
        self.num_envs, self.interval, self.max_decisions = int(num_envs), int(interval), max_decisions
        self.action_mode = action_mode
        self.action_set = check_action_set(action_mode, action_set)
        self.reward_config = RewardConfig.from_any(reward)
        self.obs_schema = get_schema(check_schema_version("obs_schema", obs_schema))
        self.window = window
        self._sim_kwargs = dict(sim_kwargs or {})
        self.domain = None
        if domain is not None:
            from dynamix_gym.envs.randomized import DomainRandomization

            if worlds is not None:
                raise ValueError("give either worlds or domain, not both")
            self.domain = DomainRandomization(**domain) if isinstance(domain, Mapping) else domain
        self._domains = None
        if domain_workers is not None:
            if self.domain is None:
                raise ValueError("domain_workers needs a domain")
            if len(domain_workers) != self.num_envs:
                raise ValueError(
                    f"domain_workers has {len(domain_workers)} entries for num_envs={self.num_envs}"
                )
            self._domains = [replace(self.domain, workers=int(n)) for n in domain_workers]
        base = dict(world or {})
        unknown = sorted(set(base) - set(WORLD_KEYS))
        if unknown:
            raise ValueError(f"unknown world keys {unknown}; known: {list(WORLD_KEYS)}")
        if worlds is not None and len(worlds) != self.num_envs:
            raise ValueError(f"worlds has {len(worlds)} entries for num_envs={self.num_envs}")
        self._worlds = [dict(base, **(worlds[i] if worlds is not None else {})) for i in range(self.num_envs)]
        for w in self._worlds:
            bad = sorted(set(w) - set(WORLD_KEYS))
            if bad:
                raise ValueError(f"unknown world keys {bad}; known: {list(WORLD_KEYS)}")
        first = [self._backend(i, np.random.default_rng(0))[0] for i in range(self.num_envs)]
        self.specs = [b.spec for b in first]
        self.sizes = np.array([s.num_workers for s in self.specs], dtype=np.int64)
        self.width = int(self.sizes.max())
        self.engine = BatchedSimulator(
            [b.sim for b in first], noise=noise, seed=noise_seed, max_workers=self.width
        )
        self._noise_seeded = noise_seed is not None or noise == "stream"
        self.encoder = BatchedEncoder(self.num_envs, self.width, window=window)
        self._slow_encoders: list[Any] = [None] * self.num_envs  # schema 2 / 3: one encoder per cluster
        c, w = self.num_envs, self.width
        self.valid = self.engine.world.valid
        self.min_batch, self.max_batch = self.engine.world.min_batch, self.engine.world.max_batch
        self.batches = np.ones((c, w), dtype=np.int64)
        self.initial = np.ones((c, w), dtype=np.int64)
        self.time_budget_s = np.ones(c)
        self.target = np.ones(c)
        self.decisions = np.zeros(c, dtype=np.int64)
        self.prev_val = np.zeros(c)
        self.rngs: list[np.random.Generator | None] = [None] * c
        self.episode_config: list[dict[str, Any] | None] = [None] * c
        self.last_report: BatchReport | None = None
        # each cluster's last report and measured reconfiguration pause (the balanced splits' input)
        self._reports: list[Any] = [None] * c
        self._reconfig_s: list[float | None] = [None] * c
        for i, b in enumerate(first):
            self._install(i, b)

    # --- worlds -------------------------------------------------------------------------------------
    def _backend(self, i: int, rng: np.random.Generator) -> tuple[SimBackend, dict[str, Any] | None]:
        """Cluster ``i``'s world: drawn from the domain with ``rng`` (and its config), else fixed."""
        if self.domain is not None:
            config = (self.domain if self._domains is None else self._domains[i]).sample(rng)
            return SimBackend(**config, **self._sim_kwargs), config
        return SimBackend(**self._worlds[i], **self._sim_kwargs), None

    def _install(self, i: int, backend: SimBackend) -> None:
        spec = backend.spec
        if spec.num_workers > self.width:
            raise ValueError(f"a world of {spec.num_workers} workers does not fit this batch's {self.width}")
        self.engine.set_world(i, backend.sim)
        self.specs[i] = spec
        self.sizes[i] = spec.num_workers
        self.time_budget_s[i] = spec.time_budget_s
        self.target[i] = spec.target_accuracy
        self.encoder.set(i, spec, spec.time_budget_s)
        self.initial[i] = 1
        self.initial[i, : spec.num_workers] = spec.initial_batch
        if self.obs_schema.version != "1":
            self._slow_encoders[i] = make_encoder(self.obs_schema.version, spec, window=self.window)

    # --- episodes -----------------------------------------------------------------------------------
    def seed_rows(self, rows: np.ndarray, seeds: Sequence[int | None] | None) -> None:
        """Fresh generators for ``rows`` (``seeds[j]`` for row ``rows[j]``), as ``Env.reset(seed=)``
        makes them; rows without a seed keep theirs (a new one if they have none)."""
        for j, i in enumerate(rows.tolist()):
            s = None if seeds is None else seeds[j]
            if s is not None or self.rngs[i] is None:
                self.rngs[i] = seeding.np_random(s)[0]
        if not self._noise_seeded:
            first = None if seeds is None else seeds[0]
            self.engine.noise.rng = batch_generator(first)
            self._noise_seeded = True

    def start(self, rows: np.ndarray) -> BatchReport:
        """New episodes of ``rows`` (generators already set): new worlds under a domain, fresh runs,
        the warm-up interval at the initial batches."""
        for i in rows.tolist():
            rng = self.rngs[i]
            if self.domain is not None:
                backend, self.episode_config[i] = self._backend(i, rng)
                self._install(i, backend)
            self.engine.reset(i, rng)
        self.encoder.reset(rows)
        for i in rows.tolist():
            if self._slow_encoders[i] is not None:
                self._slow_encoders[i].reset()
        self.decisions[rows] = 0
        self.batches[rows] = self.initial[rows]
        report = self.engine.run_interval(self.batches[rows], self.interval, idx=rows)
        self.prev_val[rows] = report.val_accuracy
        row_reports = self._row_reports(rows, report, fresh=True)
        self._encoded = self._encode(rows, report, row_reports)
        return report

    def _row_reports(self, rows: np.ndarray, report: BatchReport, fresh: bool = False) -> list[Any] | None:
        """``rows``' reports as :class:`sim.protocol.IntervalReport` when a slow encoder or a balanced
        split reads them (else None); a balanced split's last reports and pauses kept (``fresh``:
        a new episode's, whose earlier pause is forgotten, as the per-cluster env's reset does)."""
        balanced = self.split in BALANCED_SPLITS
        if self.obs_schema.version == "1" and not balanced:
            return None
        out = [self.engine.report(report, j) for j in range(len(rows))]
        if balanced:
            for i, r in zip(rows.tolist(), out, strict=True):
                self._reports[i] = r
                self._reconfig_s[i] = observed_reconfig_s(None if fresh else self._reconfig_s[i], r)
        return out

    def _split(self, requested: np.ndarray) -> np.ndarray:
        """The batches a balanced split makes of ``requested`` ``[C, W]`` (each cluster's by the
        per-cluster env's rule over its last report); ``requested`` as is under ``split='policy'``."""
        if self.split not in BALANCED_SPLITS:
            return requested
        out = requested.copy()
        for i in range(self.num_envs):
            n = int(self.sizes[i])
            out[i, :n] = split_batches(
                self.split,
                requested[i, :n],
                self.batches[i, :n],
                self._reports[i],
                self.specs[i],
                self.split_tolerance,
                self._reconfig_s[i],
            )
        return out

    def _encode(
        self, rows: np.ndarray, report: BatchReport, row_reports: list[Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.obs_schema.version == "1":
            return self.encoder.encode(rows, report)
        if row_reports is None:
            row_reports = [self.engine.report(report, j) for j in range(len(rows))]
        fw = self.obs_schema.worker_dim
        worker = np.zeros((len(rows), self.width, fw), dtype=np.float32)
        glob = np.zeros((len(rows), self.obs_schema.global_dim), dtype=np.float32)
        for j, i in enumerate(rows.tolist()):
            n = int(self.sizes[i])
            obs = self._slow_encoders[i].encode(row_reports[j])
            worker[j, :n] = obs[: n * fw].reshape(n, fw)
            glob[j] = obs[n * fw :]
        return worker, glob

    def encoded(self) -> tuple[np.ndarray, np.ndarray]:
        """The latest (per-worker [C, W, Fw], global [C, Fg]) features of the rows last encoded."""
        return self._encoded

    def apply_actions(self, actions: np.ndarray) -> np.ndarray:
        """New batches ``[C, W]`` for per-worker ``actions`` ``[C, W]`` (padded entries ignored),
        kept within each worker's range (as :func:`dynamix_gym.actions.apply_action`)."""
        a = np.asarray(actions)
        if a.shape != (self.num_envs, self.width):
            raise ValueError(f"actions must have shape ({self.num_envs}, {self.width}), got {a.shape}")
        valid = self.valid
        if self.action_mode in ("delta", "scale"):
            if a.dtype.kind not in "iu":
                if a.dtype.kind != "f" or not np.all(
                    np.isfinite(a[valid]) & (a[valid] == np.round(a[valid]))
                ):
                    raise ValueError(f"actions must be whole step indices in [0, {self.action_set.size - 1}]")
            ai = np.where(valid, a, 0).astype(np.int64)
            if ai.min() < 0 or ai.max() >= self.action_set.size:
                raise ValueError(
                    f"actions must be step indices in [0, {self.action_set.size - 1}], got {a.tolist()}"
                )
            steps = self.action_set[ai]
            if self.action_mode == "delta":
                requested = self.batches + steps
            else:
                requested = np.rint(self.batches * steps).astype(np.int64)
        else:
            af = np.where(valid, a, 0.0).astype(np.float64)
            if not (np.all(np.isfinite(af)) and af.min() >= -1.0 and af.max() <= 1.0):
                raise ValueError(f"continuous actions must lie in [-1, 1], got {a.tolist()}")
            requested = np.rint(self.batches * (1.0 + CONTINUOUS_SCALE * af)).astype(np.int64)
        return np.where(valid, np.minimum(np.maximum(requested, self.min_batch), self.max_batch), 1)

    def step(self, actions: np.ndarray):
        """One interval of every cluster. Returns (report, reward, terminated, truncated, finished
        rows' report, reset rows' warm-up report)."""
        self.batches = self._split(self.apply_actions(actions))
        report = self.engine.run_interval(self.batches, self.interval)
        self.last_report = report
        rows = np.arange(self.num_envs)
        self._encoded = self._encode(rows, report, self._row_reports(rows, report))
        self.decisions += 1
        terminated = report.val_accuracy >= self.target
        truncated = ~terminated & (report.wall_time_s >= self.time_budget_s)
        if self.max_decisions is not None:
            truncated |= ~terminated & (self.decisions >= self.max_decisions)
        reward = batched_reward(self.reward_config, report, self.valid, self.prev_val, terminated)
        self.prev_val = report.val_accuracy.copy()
        return report, reward, terminated, truncated

    def masks(self) -> np.ndarray:
        """``[C, W, A]`` bool: the steps that keep each worker within its range (padded: none but
        the first, so that a masked distribution stays defined)."""
        if self.action_mode not in ("delta", "scale"):
            raise ValueError(
                f"action masks exist in the discrete action modes; this batch is in {self.action_mode!r}"
            )
        steps = self.action_set[None, None, :]
        b = self.batches[:, :, None]
        cand = b + steps if self.action_mode == "delta" else np.rint(b * steps)
        ok = (cand >= self.min_batch[:, :, None]) & (cand <= self.max_batch[:, :, None])
        pad = ~self.valid
        if pad.any():
            ok[pad] = False
            ok[pad, 0] = True
        return ok


def split_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None] | None:
    """Per-env seeds of a vector reset: ``seed + i`` (as Gymnasium's sync vector env), a list as is."""
    if seed is None:
        return None
    if isinstance(seed, int | np.integer):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"seed must be an int or a list of {num_envs} seeds, got {len(seeds)}")
    return seeds
