"""Pollux / AdaptDL: the global batch that maximises goodput = throughput x statistical efficiency."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.optimize

from dynamix_gym.controllers.base import BaseController
from dynamix_gym.controllers.threads import single_blas_thread
from dynamix_gym.stats import NoiseScaleEstimator
from sim.protocol import BackendSpec
from sim.scaling import statistical_efficiency

#: Parameter order of the throughput model (AdaptDL's ``PerfParams``).
PERF_PARAMS: tuple[str, ...] = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")


@dataclass(frozen=True)
class PerfParams:
    """AdaptDL's throughput model of one synchronous data-parallel step (``adaptdl/goodput.py``).

    T_compute(b)     = alpha_c + beta_c * b                     # b: local batch
    T_network(R, n)  = alpha_n + beta_n * max(R - 2, 0)         # n > 1 nodes (inter-node)
                     = alpha_r + beta_r * max(R - 2, 0)         # one node, R > 1 replicas
                     = 0                                        # R = 1
    T_step           = (T_compute ** gamma + T_network ** gamma) ** (1 / gamma)   # gamma in [1, 10]
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def compute_time_s(self, local_batch: np.ndarray | float) -> np.ndarray:
        return self.alpha_c + self.beta_c * np.asarray(local_batch, dtype=np.float64)

    def network_time_s(self, nodes: np.ndarray | int, replicas: np.ndarray | int) -> np.ndarray:
        return _network(np.asarray(self.as_array()), nodes, replicas)

    def step_time_s(self, local_batch, nodes, replicas) -> np.ndarray:
        return _predict(np.asarray(self.as_array()), local_batch, nodes, replicas)[0]

    def as_array(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in PERF_PARAMS])


def _network(p: np.ndarray, nodes, replicas) -> np.ndarray:
    nodes = np.asarray(nodes)
    replicas = np.asarray(replicas, dtype=np.float64)
    retro = np.maximum(replicas - 2, 1e-8)
    t = np.where(nodes > 1, p[2] + p[3] * retro, p[4] + p[5] * retro)
    return np.where(replicas > 1, t, 1e-8)


def _predict(p: np.ndarray, local_batch, nodes, replicas) -> tuple[np.ndarray, np.ndarray]:
    compute = p[0] + p[1] * np.asarray(local_batch, dtype=np.float64)
    network = _network(p, nodes, replicas)
    gamma = p[6]
    return (compute**gamma + network**gamma) ** (1.0 / gamma), compute


def _objective(
    p: np.ndarray,
    inter: np.ndarray,
    retro: np.ndarray,
    multi: np.ndarray,
    local_batch: np.ndarray,
    log_step: np.ndarray,
    log_compute: np.ndarray,
    w: np.ndarray,
) -> float:
    """AdaptDL's fitting loss: RMSE of log step and compute times, plus its two regularisers.

    ``inter``: inter-node configurations; ``retro``: max(R - 2, 1e-8); ``multi``: R > 1;
    ``w``: weights summing to one.
    """
    compute = p[0] + p[1] * local_batch
    network = np.where(multi, np.where(inter, p[2] + p[3] * retro, p[4] + p[5] * retro), 1e-8)
    gamma = p[6]
    step = (compute**gamma + network**gamma) ** (1.0 / gamma)
    err1 = math.sqrt(float(w @ (np.log(step) - log_step) ** 2))
    err2 = math.sqrt(float(w @ (np.log(compute) - log_compute) ** 2))
    reg1 = 1e-3 * (gamma - 1.0) ** 2  # towards small gamma: easier to fit the alphas and betas
    reg2 = 1e-2 * ((p[3] / p[2]) ** 2 + (p[5] / p[4]) ** 2)  # optimistic: little retrogression
    return err1 + err2 + reg1 + reg2


def fit_perf_params(
    nodes: np.ndarray,
    replicas: np.ndarray,
    local_batch: np.ndarray,
    step_time: np.ndarray,
    compute_time: np.ndarray,
    weights: np.ndarray | None = None,
    x0: np.ndarray | None = None,
) -> PerfParams:
    """Fit :class:`PerfParams` to measured (nodes, replicas, local batch) -> (step, compute) times.

    As AdaptDL's ``fit_perf_params``: L-BFGS-B on :func:`_objective` within [1e-8, inf) for the
    alphas and betas and [1, 10] for gamma; parameters the data cannot identify are pinned (alpha_c
    to half the mean compute time when one local batch was seen, which is optimistic about scaling
    up; the network terms of configurations never observed to their lower bounds).
    """
    nodes = np.asarray(nodes)
    replicas = np.asarray(replicas)
    local_batch = np.asarray(local_batch, dtype=np.float64)
    weights = np.ones(local_batch.shape) if weights is None else np.asarray(weights, dtype=np.float64)
    init = np.array([1e-1, 1e-2] * 3 + [1.0 + 1e-3]) if x0 is None else np.asarray(x0, dtype=np.float64)
    lower = np.array([1e-8] * 6 + [1.0])
    upper = np.array([np.inf] * 6 + [10.0])
    fixed = np.zeros(7, dtype=bool)
    pinned = init.copy()
    if np.unique(local_batch).size == 1:
        pinned[0] = np.average(compute_time, weights=weights) / 2.0
        fixed[0] = True
    if not np.any(nodes > 1):
        pinned[2:4] = lower[2:4]
        fixed[2:4] = True
    if not np.any((nodes == 1) & (replicas > 1)):
        pinned[4:6] = lower[4:6]
        fixed[4:6] = True
    if not np.any(replicas > 2):
        pinned[[3, 5]] = lower[[3, 5]]
        fixed[[3, 5]] = True
    free = ~fixed
    # The alphas and betas span four orders of magnitude: search their logarithms (gamma as is),
    # which conditions L-BFGS-B's finite-difference steps; the bounds are AdaptDL's.
    logs = free & (np.arange(7) < 6)
    log_lower, log_upper = np.log(lower), np.log(np.minimum(upper, 1e4))

    def unpack(x: np.ndarray) -> np.ndarray:
        p = pinned.copy()
        p[free] = np.where(logs[free], np.exp(x), x)
        return p

    start = np.clip(init, lower * (1 + 1e-6), np.minimum(upper, 1e4))
    start = np.where(logs, np.log(start), start)[free]
    bounds = list(
        zip(np.where(logs, log_lower, lower)[free], np.where(logs, log_upper, upper)[free], strict=True)
    )
    replicas_f = replicas.astype(np.float64)
    args = (
        nodes > 1,
        np.maximum(replicas_f - 2, 1e-8),
        replicas > 1,
        local_batch,
        np.log(np.asarray(step_time, dtype=np.float64)),
        np.log(np.asarray(compute_time, dtype=np.float64)),
        weights / weights.sum(),
    )
    result = scipy.optimize.minimize(
        lambda x: _objective(unpack(x), *args), start, method="L-BFGS-B", bounds=bounds
    )
    return PerfParams(*unpack(result.x))


class PolluxController(BaseController):
    """Pollux's goodput-optimal batch size, as AdaptDL's adaptive data loader chooses it.

    Source: A. Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
    Learning", OSDI'21, and its implementation AdaptDL (``adaptdl/goodput.py``,
    ``adaptdl/torch/data.py``). Only the job-level (batch size) half of Pollux is used: the
    replicas are the backend's workers.

    Rules:

    * Throughput model: :class:`PerfParams`, refitted online with scipy (as
      :func:`fit_perf_params`) to the profile of every (nodes, replicas, local batch) run so far,
      each the interval-weighted mean of the measured step time (the iteration time) and compute
      time. The workers synchronise every step, so the step's compute time is the slowest live
      worker's.
    * Statistical efficiency from the gradient noise scale B (two-batch estimator with EMAs,
      :class:`~dynamix_gym.stats.NoiseScaleEstimator`):

          E(M) = (B + M0) / (B + M),        goodput(M) = R * b / T_step(b) * E(R * b)

      with the learning rate scaled by AdaScale (the simulator's ``adascale`` rule does this).
    * Every worker runs the same local batch b = ceil(M / R) (Pollux does not split unevenly);
      b lies within [``min_local_batch``, the smallest memory cap among live workers] (no
      gradient accumulation), M within [M0, ``max_global_batch``], searched over 50 geometric
      values as ``GoodputFunction.optimize`` does.
    * Bounds follow the workload and cluster, never CIFAR-10's absolute values: AdaptDL asks its
      user for the largest batch that fits, which is the workers' memory, so by default
      ``max_global_batch`` = sum_i max_batch_i (the local cap binds first: R x the smallest cap),
      and ``min_local_batch`` = the largest of the workers' min_batch (AdaptDL's default
      ``local_bsz_bounds=None``: no bound of its own).
    * Re-optimised once per epoch of the training set (``report.epoch``); the first suggestion is
      taken as is, later ones only if their predicted goodput beats the current batch's by the
      factor ``speedup_threshold`` (AdaptDL's 1.05).

    Args:
        max_global_batch: largest global batch the job allows (AdaptDL's ``max_batch_size``),
            >= 1; ``None``: the workers' memory, sum_i max_batch_i.
        min_local_batch: smallest local batch (AdaptDL's ``local_bsz_bounds[0]``), >= 1;
            ``None``: the workers' own floor, max_i min_batch_i.
        speedup_threshold: predicted goodput ratio a new batch must reach, >= 1.
        noise_smoothing: EMA weight of the newest interval in the noise-scale estimate, (0, 1].
        grid_points: global batches searched (>= 2).
    """

    name: ClassVar[str] = "pollux"

    def __init__(
        self,
        max_global_batch: int | None = None,
        min_local_batch: int | None = None,
        speedup_threshold: float = 1.05,
        noise_smoothing: float = 0.5,
        grid_points: int = 50,
    ) -> None:
        for field, value in (("max_global_batch", max_global_batch), ("min_local_batch", min_local_batch)):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"PolluxController.{field} must be None or an integer >= 1, got {value!r}")
        if speedup_threshold < 1.0:
            raise ValueError(f"PolluxController.speedup_threshold must be >= 1, got {speedup_threshold!r}")
        if not 0.0 < noise_smoothing <= 1.0:
            raise ValueError(f"PolluxController.noise_smoothing must be in (0, 1], got {noise_smoothing!r}")
        if int(grid_points) != grid_points or grid_points < 2:
            raise ValueError(f"PolluxController.grid_points must be an integer >= 2, got {grid_points!r}")
        self.max_global_batch = None if max_global_batch is None else int(max_global_batch)
        self.min_local_batch = None if min_local_batch is None else int(min_local_batch)
        self.speedup_threshold = float(speedup_threshold)
        self.noise_smoothing = float(noise_smoothing)
        self.grid_points = int(grid_points)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self._max_m = int(spec.max_batch.sum()) if self.max_global_batch is None else self.max_global_batch
        self._min_local = int(spec.min_batch.max()) if self.min_local_batch is None else self.min_local_batch
        self.noise = NoiseScaleEstimator(self.noise_smoothing)
        # (nodes, replicas, local batch) -> [iterations, sum of step times, sum of compute times]
        self._profile: dict[tuple[int, int, int], list[float]] = {}
        self.perf_params: PerfParams | None = None
        self._local: int | None = None
        self._chosen = False  # the first suggestion is taken without the speedup threshold
        self._last_epoch = -1
        #: One row per decision: (epoch, noise-scale estimate or nan, global batch chosen).
        self.history: list[tuple[float, float, int]] = []

    # --- measurements --------------------------------------------------------------------------
    def _record(self, report) -> tuple[int, int] | None:
        alive = report.alive & (report.compute_time_s > 0)
        if not alive.any():
            return None
        nodes = len(set(np.asarray(self.spec.node_of_worker)[alive].tolist()))
        replicas = int(alive.sum())
        key = (nodes, replicas, int(report.local_batch[alive].max()))
        k = float(report.iterations)
        row = self._profile.setdefault(key, [0.0, 0.0, 0.0])
        row[0] += k
        row[1] += k * float(report.iteration_time_s[alive].mean())
        row[2] += k * float(report.compute_time_s[alive].max())
        return nodes, replicas

    def _fit(self) -> PerfParams:
        keys = np.array(list(self._profile), dtype=np.float64)
        rows = np.array(list(self._profile.values()))
        x0 = None if self.perf_params is None else self.perf_params.as_array()
        self.perf_params = fit_perf_params(
            keys[:, 0],
            keys[:, 1],
            keys[:, 2],
            rows[:, 1] / rows[:, 0],
            rows[:, 2] / rows[:, 0],
            rows[:, 0],
            x0,
        )
        return self.perf_params

    def goodput(
        self, local_batch: np.ndarray | float, nodes: int, replicas: int, noise_scale: float
    ) -> np.ndarray:
        """Predicted goodput (samples/s x efficiency) of every worker at ``local_batch``."""
        b = np.asarray(local_batch, dtype=np.float64)
        m = replicas * b
        throughput = m / self.perf_params.step_time_s(b, nodes, replicas)
        return throughput * statistical_efficiency(noise_scale, m, self.spec.base_batch)

    # --- the decision --------------------------------------------------------------------------
    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        report = info["report"]
        current = np.asarray(info["local_batches"], dtype=np.int64)
        noise = self.noise.update(report)
        config = self._record(report)
        if self._local is None:
            self._local = int(current.max())
        epoch = math.floor(report.epoch)
        if config is not None and noise is not None and epoch > self._last_epoch:
            self._last_epoch = epoch
            with single_blas_thread():
                self._reoptimise(config, noise, report.alive)
        batches = np.clip(
            np.full(self.spec.num_workers, self._local), self.spec.min_batch, self.spec.max_batch
        )
        live = report.alive if report.alive.any() else np.ones_like(report.alive)
        self.history.append(
            (float(report.epoch), np.nan if noise is None else noise, int(batches[live].sum()))
        )
        return batches.astype(np.float32), None

    def _reoptimise(self, config: tuple[int, int], noise: float, alive: np.ndarray) -> None:
        nodes, replicas = config
        self._fit()
        spec = self.spec
        cap = int(spec.max_batch[alive].min())
        floor = max(self._min_local, int(spec.min_batch[alive].max()))
        lo_m = max(spec.base_batch, floor * replicas)
        hi_m = max(lo_m, min(self._max_m, cap * replicas))
        totals = np.geomspace(lo_m, hi_m, self.grid_points)
        local = np.ceil(totals / replicas - 1e-8)
        local = local[(local >= floor) & (local <= cap)]
        if local.size == 0:
            return
        rates = self.goodput(local, nodes, replicas, noise)
        best = int(local[np.argmax(rates)])
        if self._chosen:
            current_rate = float(self.goodput(min(self._local, cap), nodes, replicas, noise))
            if float(rates.max()) <= self.speedup_threshold * current_rate:
                return
        self._chosen = True
        self._local = best
