"""The static facts of a batch of simulated worlds as arrays, for :mod:`sim.batched`.

A world is described by a :class:`sim.engine.Simulator` (its cluster, workload, scenario, fitted
models and overheads); :class:`WorldArrays` copies what the engine's arithmetic reads into arrays of
shape ``[clusters, workers]`` (padded to the largest cluster, ``valid`` marking real workers) and
``[clusters]``, and :class:`ConvergenceTables` stacks the clusters' convergence models, so that one
numpy call evaluates every cluster's model at its own progress. The equations are the engine's and
:mod:`sim.convergence`'s; only the layout differs.
"""

from __future__ import annotations

import numpy as np

from sim.convergence import GRAD_NOISE_DOF, ConvergenceModel
from sim.engine import Simulator
from sim.scaling import LR_RULES

#: lr_rule -> code in :attr:`ConvergenceTables.rule`.
RULE_CODES = {rule: i for i, rule in enumerate(LR_RULES)}


class WorldArrays:
    """Per-cluster parameters of ``clusters`` worlds of up to ``max_workers`` workers.

    Per worker ``[C, W]``: the compute model (``alpha``, ``beta``, ``exponent``, ``knee_b``,
    ``knee_beta``, ``host``, ``k``), the batch range, the node, the memory-utilisation terms.
    Per cluster ``[C]``: worker count, overheads, noise levels, workload constants. Per cluster and
    replica count ``[C, W + 1, 2]`` (second index: replicas on one node or on several): the
    all-reduce's base time and overlap exponent, and ``[C, W + 1]`` its bytes per iteration.
    """

    def __init__(self, clusters: int, max_workers: int) -> None:
        c, w = clusters, max_workers
        self.clusters, self.max_workers = c, w
        self.sims: list[Simulator | None] = [None] * c
        f = np.zeros
        self.valid = f((c, w), dtype=bool)
        self.num_workers = f(c, dtype=np.int64)
        for name in ("alpha", "beta", "exponent", "knee_beta", "host", "gpu_mem_fixed",
                     "gpu_mem_per_sample", "host_mem_fixed", "host_mem_per_sample"):  # fmt: skip
            setattr(self, name, f((c, w)))
        self.k = np.ones((c, w))
        self.knee_b = np.full((c, w), np.inf)
        self.min_batch = np.ones((c, w), dtype=np.int64)
        self.max_batch = np.ones((c, w), dtype=np.int64)
        self.node = f((c, w), dtype=np.int64)
        for name in ("reconfig_delay_s", "interval_overhead_s", "compute_cv", "bandwidth_cv",
                     "latency_jitter_s", "loss_rate", "meas_cv", "val_samples", "num_classes",
                     "samples_per_epoch"):  # fmt: skip
            setattr(self, name, f(c))
        self.compute_on_host = f(c, dtype=bool)
        self.base_sync_s = f((c, w + 1, 2))
        self.gamma = np.ones((c, w + 1, 2))
        self.bytes_per_iteration = f((c, w + 1))

    def set(self, i: int, sim: Simulator) -> None:
        """Slot ``i`` holds ``sim``'s world from now on."""
        n = sim.num_workers
        if n > self.max_workers:
            raise ValueError(f"a world of {n} workers does not fit a batch of max_workers={self.max_workers}")
        if sim.progress_scale != 1.0:
            raise ValueError(
                "the batched engine runs progress_scale 1.0 only (no elastic learning-rate scale)"
            )
        if sim.convergence.params.grad_norm_cv is not None:
            raise ValueError(
                f"workload {sim.convergence.params.name} has a fitted gradient spread (grad_norm_cv); the "
                "batched engine draws the default spread only (GRAD_NOISE_DOF): run it on the SimPy engine"
            )
        self.sims[i] = sim
        self.num_workers[i] = n
        self.valid[i] = False
        self.valid[i, :n] = True
        for name, src in (("alpha", sim._alpha), ("beta", sim._beta), ("exponent", sim._exponent),
                          ("knee_b", sim._knee_b), ("knee_beta", sim._knee_beta), ("host", sim._host),
                          ("k", sim._k), ("gpu_mem_fixed", sim._gpu_mem_fixed),
                          ("gpu_mem_per_sample", sim._gpu_mem_per_sample),
                          ("host_mem_fixed", sim._host_mem_fixed),
                          ("host_mem_per_sample", sim._host_mem_per_sample)):  # fmt: skip
            row = getattr(self, name)[i]
            row[:] = row.dtype.type(1.0 if name in ("k", "exponent") else 0.0)
            row[:n] = src
        self.knee_b[i, n:] = np.inf
        self.min_batch[i] = 1
        self.min_batch[i, :n] = sim.min_batch
        self.max_batch[i] = 1
        self.max_batch[i, :n] = sim.max_batch
        self.node[i] = -1
        self.node[i, :n] = sim.node_of_worker
        sc, wl = sim.scenario, sim.workload
        self.reconfig_delay_s[i] = sim.reconfig_delay_s
        self.interval_overhead_s[i] = sim.interval_overhead_s
        self.compute_cv[i] = sc.compute_noise_cv
        self.bandwidth_cv[i] = sc.network.bandwidth_cv
        self.latency_jitter_s[i] = sc.network.latency_jitter_s
        self.loss_rate[i] = sc.network.loss_rate
        self.meas_cv[i] = sc.measurement_noise_cv
        self.val_samples[i] = wl.val_samples
        self.num_classes[i] = wl.num_classes
        self.samples_per_epoch[i] = wl.samples_per_epoch
        self.compute_on_host[i] = sim.compute_on_host
        self.base_sync_s[i] = 0.0
        self.gamma[i] = 1.0
        self.bytes_per_iteration[i] = 0.0
        for r in range(1, n + 1):
            for multi in (0, 1):
                comm = sim._comm(r, 1 + multi)  # the model reads only whether nodes > 1
                self.base_sync_s[i, r, multi] = comm.base_sync_s
                self.gamma[i, r, multi] = comm.gamma
            self.bytes_per_iteration[i, r] = sim._comm(r, 1).bytes_per_iteration


class ConvergenceTables:
    """The convergence models of ``clusters`` worlds, stacked: row ``i`` is slot ``i``'s model's
    lookup tables (all models tabulate on grids of the same number of points)."""

    def __init__(self, clusters: int) -> None:
        self.models: list[ConvergenceModel | None] = [None] * clusters
        self._rows: dict[int, int] = {}
        self.points = 0
        c = clusters
        f = np.zeros
        for name in ("grid_lo", "grid_step", "shape_step", "base_batch", "total_progress", "acc_chance",
                     "acc_ceiling", "gap_per_doubling", "stretch_exponent", "batch_memory_progress",
                     "none_exponent", "unstable_exponent", "train_gap", "log2_ref", "grid_hi",
                     "shape_hi"):  # fmt: skip
            setattr(self, name, f(c))
        self.progress_noise_factor = np.ones(c)
        self.stable_gain = np.full(c, np.inf)  # inf: no learning-rate limit
        self.rule = f(c, dtype=np.int64)
        self.log_sqr = self.log_var = self.noise = self.shape = None

    def set(self, i: int, model: ConvergenceModel) -> None:
        p = model.params
        grid, sgrid = model._grid, model._shape_grid
        if self.log_sqr is None:
            self.points = len(grid)
            c = len(self.models)
            self.log_sqr, self.log_var = np.zeros((c, self.points)), np.zeros((c, self.points))
            self.noise, self.shape = np.ones((c, self.points)), np.zeros((c, self.points))
        if len(grid) != self.points or len(sgrid) != self.points:
            raise ValueError("every convergence model must tabulate on grids of the same size")
        self.models[i] = model
        self.log_sqr[i], self.log_var[i] = model._log_sqr, model._log_var
        self.noise[i], self.shape[i] = model._noise, model._shape
        self.grid_lo[i], self.grid_hi[i] = grid[0], grid[-1]
        self.grid_step[i] = (grid[-1] - grid[0]) / (self.points - 1)
        self.shape_hi[i] = sgrid[-1]
        self.shape_step[i] = sgrid[-1] / (self.points - 1)
        self.base_batch[i] = model.base_batch
        for name in ("total_progress", "acc_chance", "acc_ceiling", "gap_per_doubling", "stretch_exponent",
                     "batch_memory_progress", "none_exponent", "train_gap"):  # fmt: skip
            getattr(self, name)[i] = getattr(p, name)
        self.unstable_exponent[i] = p.lr_unstable_exponent
        self.progress_noise_factor[i] = p.progress_noise_factor
        self.stable_gain[i] = np.inf if p.lr_stable_gain is None else p.lr_stable_gain
        self.log2_ref[i] = model._log2_ref
        self.rule[i] = RULE_CODES[model.lr_rule]

    # --- lookups (np.interp on each row's grid; the tables are held constant past their ends) ------
    def _interp(self, table: np.ndarray, idx: np.ndarray, x: np.ndarray, lo, hi, step) -> np.ndarray:
        pos = (np.clip(x, lo, hi) - lo) / step
        cell = np.minimum(pos.astype(np.int64), self.points - 2)
        frac = pos - cell
        y0 = table[idx, cell]
        return y0 + (table[idx, cell + 1] - y0) * frac

    def _on_grid(self, table: np.ndarray, idx: np.ndarray, progress: np.ndarray) -> np.ndarray:
        return self._interp(table, idx, progress, self.grid_lo[idx], self.grid_hi[idx], self.grid_step[idx])

    def noise_scale(self, idx: np.ndarray, progress: np.ndarray) -> np.ndarray:
        return self._on_grid(self.noise, idx, progress)

    def grad_stats(self, idx: np.ndarray, progress: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.exp(self._on_grid(self.log_sqr, idx, progress)), np.exp(
            self._on_grid(self.log_var, idx, progress)
        )

    def progress_per_step(
        self, idx: np.ndarray, global_batch: np.ndarray, progress: np.ndarray, reported: bool = False
    ) -> np.ndarray:
        """:func:`sim.scaling.progress_gain` of each cluster's rule (``sim.convergence``), the
        statistics read at ``progress`` (the noise counter q); ``reported=True``: at the reported
        noise (the counter's own advance)."""
        bn = self.noise_scale(idx, progress)  # the reported noise: AdaScale's learning rate
        base = self.base_batch[idx]
        scale = global_batch / base
        g_ada = global_batch / base * ((bn + base) / (bn + global_batch))
        k = self.progress_noise_factor[idx]
        if reported or np.all(k == 1.0):
            r_ada = g_ada
        else:  # progress at the model's progress noise k B_noise (sim.convergence)
            bp = k * bn
            r_ada = global_batch / base * ((bp + base) / (bp + global_batch))
        rule = self.rule[idx]
        root = np.sqrt(scale)
        r = np.where(rule == RULE_CODES["sqrt"], np.minimum(root, r_ada), r_ada)
        g = np.where(rule == RULE_CODES["adascale"], g_ada, np.where(rule == RULE_CODES["sqrt"], root, scale))
        sg = self.stable_gain[idx]
        limited = g > sg
        if limited.any():
            ratio = np.where(limited, sg, 1.0) / np.where(limited, g, 1.0)  # g_s / g where limited
            r = np.where(limited, r * ratio ** self.unstable_exponent[idx], r)
        none = rule == RULE_CODES["none"]
        if none.any():
            r = np.where(none, np.minimum(scale ** self.none_exponent[idx], r_ada), r)
        return r

    def advance(
        self, idx: np.ndarray, global_batch: np.ndarray, progress: np.ndarray, noise_progress: np.ndarray,
        steps: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """:meth:`sim.convergence.ConvergenceModel.advance`: (progress, noise counter) over ``steps``
        steps, midpoint rule; the two are the same where a model's noise is not split."""
        k = self.progress_noise_factor[idx]
        if np.all(k == 1.0):
            r1 = self.progress_per_step(idx, global_batch, progress)
            dp = steps * self.progress_per_step(idx, global_batch, progress + 0.5 * steps * r1)
            return dp, dp
        q1 = self.progress_per_step(idx, global_batch, noise_progress, reported=True)
        dq = steps * self.progress_per_step(
            idx, global_batch, noise_progress + 0.5 * steps * q1, reported=True
        )
        split = steps * self.progress_per_step(idx, global_batch, noise_progress + 0.5 * dq)
        return np.where(k == 1.0, dq, split), dq

    def update_batch_memory(self, idx, memory, global_batch, d_progress):
        w = 1.0 - np.exp(-d_progress / self.batch_memory_progress[idx])
        return memory + w * (np.log2(global_batch) - memory)

    def accuracy(self, idx: np.ndarray, progress: np.ndarray, memory: np.ndarray) -> np.ndarray:
        doublings = np.maximum(0.0, memory - self.log2_ref[idx])
        chance = self.acc_chance[idx]
        ceiling = np.maximum(chance, self.acc_ceiling[idx] - self.gap_per_doubling[idx] * doublings)
        stretch = 2.0 ** (doublings * self.stretch_exponent[idx])
        s = self._interp(self.shape, idx, progress / stretch, 0.0, self.shape_hi[idx], self.shape_step[idx])
        return chance + (ceiling - chance) * s

    def train_accuracy(self, idx: np.ndarray, progress: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
        frac = np.clip(progress / self.total_progress[idx], 0.0, 1.0)
        return np.minimum(1.0, accuracy + self.train_gap[idx] * frac)


#: Gamma draws of |g|^2: shape and scale (``sim.convergence``: relative s.d. sqrt(2 / GRAD_NOISE_DOF)).
GRAD_GAMMA = (GRAD_NOISE_DOF / 2.0, 2.0 / GRAD_NOISE_DOF)
