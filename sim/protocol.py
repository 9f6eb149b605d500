"""The protocol between the env and a training backend, defined once.

A backend (the simulator's :class:`~dynamix_gym.backends.sim_backend.SimBackend`, the real DDP
adapter) runs K synchronous data-parallel iterations at the local batches it is given and returns
an :class:`IntervalReport`; :class:`BackendSpec` holds its static facts and :class:`Backend` is the
protocol itself. The env encodes observations and computes rewards from the report alone, so every
backend shares that code, and every controller reads only the report.

The report is plain data (numpy arrays and floats, no simulator types), so it pickles and compares
like any record. ``truth`` is the simulator's hidden state as plain values (``None`` on real
backends); only oracles and tests may read it. The simulator's noise-free models, which an oracle
queries at candidate batches, are not in the report: a simulated backend exposes them as its
``ground_truth`` handle (:class:`GroundTruth`), which the env hands on as ``info["ground_truth"]``.
Real backends measure per-rank timings and build their report with
:meth:`IntervalReport.from_rank_timings`. This module sits at the bottom of the layers (it imports
numpy and :mod:`sim.workloads` only) so that the simulator can fill the record without importing
the gym.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sim.scaling import LR_RULES as _LR_RULES
from sim.workloads import ACCURACY, QualityMetric

#: The largest job a report may describe (workers), and the largest batch any of its fields may
#: carry (samples): the bounds of the wire ranges below (the arbitrator's ``MAX_WORKERS``, ``MAX_BATCH``).
MAX_WORKERS = 1024
MAX_BATCH = 1 << 20


#: Points of a spec's compute curve by default (log-spaced over each worker's batch range).
COMPUTE_CURVE_POINTS = 9
#: The most points a compute curve may have per worker.
MAX_COMPUTE_CURVE_POINTS = 64


def _worker(dtype: type, low: float | None = None, high: float | None = None) -> dict[str, Any]:
    """Metadata of a per-worker field (an array of shape (num_workers,)) of ``dtype``, allowed in
    [low, high] (``None``: no fixed range; ``local_batch``'s is the registered spec's)."""
    return {"per_worker": True, "dtype": dtype, "range": None if low is None else (low, high)}


def _global(dtype: type, low: float, high: float) -> dict[str, Any]:
    """Metadata of a global field of ``dtype`` (``int`` or ``float``), allowed in [low, high]."""
    return {"per_worker": False, "dtype": dtype, "range": (low, high)}


@dataclass(frozen=True, eq=False)
class IntervalReport:
    """Measurements of one interval of ``iterations`` synchronous data-parallel iterations.

    Per-worker arrays (shape ``(num_workers,)``) hold means over the interval's iterations unless
    stated otherwise. Utilisations are fractions in [0, 1].

    Each measured field's metadata says whether it is per worker, its type and the range it may
    take ([low, high]); the field lists (:data:`WORKER_FIELDS`, :data:`SCALAR_FIELDS`), the ranges
    (:data:`FIELD_RANGES`), :meth:`validate`, the arbitrator's wire conversion and checks
    (:mod:`dynamix_gym.service.messages`) and the wire message's test all read it from here.
    ``events`` and ``truth`` carry none: they stay with the backend (they are not on the wire).
    """

    # --- per worker ---
    # the local batch each worker ran
    local_batch: np.ndarray = field(metadata=_worker(np.int64))
    # worker took part in the interval
    alive: np.ndarray = field(metadata=_worker(np.bool_))
    # wall time per iteration seen by the worker
    iteration_time_s: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e4))
    # input pipeline + forward + backward per iteration
    compute_time_s: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e4))
    # waiting for the slowest worker at the barrier, per iteration
    idle_time_s: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e4))
    # local samples per second of wall time
    samples_per_s: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e9))
    # gradient traffic sent by the worker, bytes/s
    net_bytes_per_s: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e12))
    # TCP segments retransmitted during the interval (count)
    tcp_retransmissions: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e9))
    cpu_util: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1.0))
    # host memory
    mem_util: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1.0))
    # fraction of wall time the device computed
    gpu_util: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1.0))
    # device memory (0 on CPU backends)
    gpu_mem_util: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1.0))
    # training-batch accuracy over the interval
    batch_accuracy: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1.0))
    batch_loss: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e6))
    # mean of the local gradient norm |g_i| over iterations
    grad_norm_mean: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e12))
    # variance of |g_i| over iterations
    grad_norm_var: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e24))
    # mean |g_i|^2 of the local (batch b_i) gradient
    local_grad_sqr: np.ndarray = field(metadata=_worker(np.float64, 0.0, 1e24))
    # --- global ---
    iterations: int = field(metadata=_global(int, 1, 1e6))
    # wall time of the interval, reconfiguration included
    interval_time_s: float = field(metadata=_global(float, 0.0, 1e7))
    # wall clock since the run started, at the end of the interval
    wall_time_s: float = field(metadata=_global(float, 0.0, 1e9))
    # time spent applying batch changes at the start of the interval
    reconfig_time_s: float = field(metadata=_global(float, 0.0, 1e6))
    # exposed (non-overlapped) all-reduce per iteration
    comm_time_s: float = field(metadata=_global(float, 0.0, 1e4))
    global_batch: int = field(metadata=_global(int, 0, MAX_WORKERS * MAX_BATCH))
    # mean |g|^2 of the all-reduced gradient (batch = global_batch)
    global_grad_sqr: float = field(metadata=_global(float, 0.0, 1e24))
    val_accuracy: float = field(metadata=_global(float, 0.0, 1.0))
    val_loss: float = field(metadata=_global(float, 0.0, 1e6))
    # samples processed during the interval
    samples: int = field(metadata=_global(int, 0, 1e15))
    # epochs of the training set completed so far
    epoch: float = field(metadata=_global(float, 0.0, 1e6))
    # faults or failures that started or ended during the interval
    events: tuple[str, ...] = ()
    truth: Mapping[str, Any] | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        """Field-by-field equality (arrays elementwise, ``truth`` key by key)."""
        if not isinstance(other, IntervalReport):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    __hash__ = None  # type: ignore[assignment]

    def __deepcopy__(self, memo: dict) -> IntervalReport:
        # Reports are immutable records and vectorised envs deep-copy infos every step: sharing
        # the record instead of copying its arrays keeps that copy cheap.
        return self

    def __copy__(self) -> IntervalReport:
        return self

    @classmethod
    def from_rank_timings(
        cls,
        *,
        local_batch: np.ndarray,
        alive: np.ndarray,
        compute_s: np.ndarray,
        wait_s: np.ndarray,
        iteration_time_s: np.ndarray,
        iterations: int,
        interval_time_s: float,
        rank_samples: np.ndarray,
        correct: np.ndarray,
        loss_sum: np.ndarray,
        grad_norm_mean: np.ndarray,
        grad_norm_var: np.ndarray,
        local_grad_sqr: np.ndarray,
        **measured: Any,
    ) -> IntervalReport:
        """The report of a real data-parallel job from what its ranks timed and counted.

        ``compute_s`` and ``wait_s`` are (N, m) per-rank times of m timed iterations (local compute;
        the all-reduce wait, whose minimum over the live ranks is the exposed communication);
        ``rank_samples``, ``correct`` and ``loss_sum`` are each rank's training samples, correct
        predictions and summed loss over the interval; the gradient statistics are per rank. Ranks
        not ``alive`` get zero idle time, throughput and gradient statistics. ``measured`` holds the
        remaining fields as measured (utilisations, network counters, wall and reconfiguration
        times, validation, epoch, events); the global batch and the samples are derived.
        """
        live = alive[:, None]
        slowest = np.where(live, compute_s, 0.0).max(axis=0)  # (m,)
        idle = np.where(live, np.maximum(slowest[None, :] - compute_s, 0.0), 0.0)
        denom = np.maximum(rank_samples, 1.0)
        global_batch = int(local_batch[alive].sum())
        return cls(
            local_batch=local_batch,
            alive=alive,
            iteration_time_s=iteration_time_s,
            compute_time_s=compute_s.mean(axis=1),
            idle_time_s=idle.mean(axis=1),
            samples_per_s=np.where(alive, local_batch * iterations / max(interval_time_s, 1e-9), 0.0),
            batch_accuracy=correct / denom,
            batch_loss=loss_sum / denom,
            grad_norm_mean=np.where(alive, grad_norm_mean, 0.0),
            grad_norm_var=np.where(alive, grad_norm_var, 0.0),
            local_grad_sqr=np.where(alive, local_grad_sqr, 0.0),
            iterations=iterations,
            interval_time_s=interval_time_s,
            comm_time_s=float(np.min(np.where(live, wait_s, np.inf), axis=0).mean()),
            global_batch=global_batch,
            samples=global_batch * iterations,
            **measured,
        )

    @property
    def num_workers(self) -> int:
        return int(self.local_batch.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (lists and floats) for logs and CSV/JSON writers."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                v = v.tolist()
            out[f.name] = v
        return out

    def validate(self) -> None:
        """Raise ``ValueError`` if a field has the wrong shape or a non-finite / negative value."""
        n = self.num_workers
        for name in WORKER_FIELDS:
            arr = np.asarray(getattr(self, name))
            if arr.shape != (n,):
                raise ValueError(f"IntervalReport.{name} has shape {arr.shape}, expected ({n},)")
            if arr.dtype != bool and not np.all(np.isfinite(arr)):
                raise ValueError(f"IntervalReport.{name} holds non-finite values: {arr}")
            if arr.dtype != bool and np.any(arr < 0):
                raise ValueError(f"IntervalReport.{name} holds negative values: {arr}")
        for name in SCALAR_FIELDS:
            v = float(getattr(self, name))
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"IntervalReport.{name} must be finite and >= 0, got {v}")


#: Per-worker fields (arrays of shape (num_workers,)), in the report's order.
WORKER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(IntervalReport) if f.metadata.get("per_worker"))
#: Global numeric fields, in the report's order.
SCALAR_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(IntervalReport) if f.metadata.get("per_worker") is False
)
#: Each measured field's type: ``np.int64`` / ``np.bool_`` / ``np.float64`` per worker, ``int`` / ``float`` global.
FIELD_DTYPES: dict[str, type] = {f.name: f.metadata["dtype"] for f in fields(IntervalReport) if f.metadata}
#: The [low, high] each numeric field may take (``local_batch``: the registered spec's range; ``alive``: a flag).
FIELD_RANGES: dict[str, tuple[float, float]] = {
    f.name: f.metadata["range"] for f in fields(IntervalReport) if f.metadata.get("range") is not None
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


@dataclass(frozen=True, eq=False)
class BackendSpec:
    """Static facts about a backend's cluster and workload."""

    gpu_types: tuple[str, ...]
    node_of_worker: tuple[int, ...]
    min_batch: np.ndarray  # (N,) smallest local batch per worker
    max_batch: np.ndarray  # (N,) largest local batch per worker (memory cap)
    initial_batch: np.ndarray  # (N,) local batches of the first interval
    base_batch: int  # M0: the batch that progress and statistical efficiency are relative to
    target_accuracy: float  # validation quality (a rising fraction, sim.workloads) that ends an episode
    time_budget_s: float  # wall-clock budget of an episode
    num_classes: int
    workload: str
    deterministic: bool  # same seed, same reports
    #: the workload's validation metric: reports carry it as the quality ``val_accuracy``, tables
    #: show ``metric.from_quality(val_accuracy)`` in the metric's own units
    metric: QualityMetric = ACCURACY
    #: how the job sets its learning rate when the global batch changes (:data:`sim.scaling.LR_RULES`;
    #: ``none``: it does not, so a larger batch trades final accuracy for speed)
    lr_rule: str = "adascale"
    #: nominal compute seconds per iteration of each worker at :func:`compute_curve_batches` (N, G):
    #: how a step's cost grows with its batch, as measured before the run (the real backends' quick
    #: calibration) or known (the simulator's fault-free compute model); ``None`` where nobody measured
    #: it. Observation schema 4 reads it (:func:`compute_elasticity`); earlier schemas ignore it.
    compute_curve_s: np.ndarray | None = None

    @property
    def num_workers(self) -> int:
        return len(self.gpu_types)

    @property
    def compute_curve_batches(self) -> np.ndarray:
        """(N, G) local batches at which :attr:`compute_curve_s` is given (G = its columns, or
        :data:`COMPUTE_CURVE_POINTS` without a curve)."""
        g = COMPUTE_CURVE_POINTS if self.compute_curve_s is None else self.compute_curve_s.shape[1]
        return compute_curve_batches(self.min_batch, self.max_batch, g)

    def __post_init__(self) -> None:
        n = len(self.gpu_types)
        if self.lr_rule not in _LR_RULES:
            raise ValueError(f"BackendSpec.lr_rule must be one of {list(_LR_RULES)}, got {self.lr_rule!r}")
        for name in ("min_batch", "max_batch", "initial_batch"):
            arr = np.asarray(getattr(self, name))
            if arr.shape != (n,):
                raise ValueError(f"BackendSpec.{name} must have shape ({n},), got {arr.shape}")
        if np.any(self.min_batch > self.max_batch):
            raise ValueError("BackendSpec.min_batch must not exceed max_batch")
        if np.any((self.initial_batch < self.min_batch) | (self.initial_batch > self.max_batch)):
            raise ValueError(
                f"BackendSpec.initial_batch {self.initial_batch.tolist()} must lie in "
                f"[min_batch, max_batch] = [{self.min_batch.tolist()}, {self.max_batch.tolist()}]"
            )
        if self.compute_curve_s is not None:
            curve = np.asarray(self.compute_curve_s, dtype=np.float64)
            if curve.ndim != 2 or curve.shape[0] != n or not 2 <= curve.shape[1] <= MAX_COMPUTE_CURVE_POINTS:
                raise ValueError(
                    f"BackendSpec.compute_curve_s must have shape ({n}, G) with 2 <= G <= "
                    f"{MAX_COMPUTE_CURVE_POINTS}, got {curve.shape}"
                )
            if not np.all(np.isfinite(curve) & (curve > 0.0)):
                raise ValueError("BackendSpec.compute_curve_s must be finite and > 0 (seconds per iteration)")
            object.__setattr__(self, "compute_curve_s", curve)


def compute_curve_batches(min_batch: np.ndarray, max_batch: np.ndarray, points: int) -> np.ndarray:
    """(N, points) local batches log-spaced from each worker's ``min_batch`` to its ``max_batch``
    (both included; real-valued: a curve is a model of cost, not a list of runnable batches)."""
    lo = np.log(np.asarray(min_batch, dtype=np.float64))
    hi = np.log(np.asarray(max_batch, dtype=np.float64))
    return np.exp(lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, int(points))[None, :])


def compute_elasticity(spec: BackendSpec, local_batch: np.ndarray) -> np.ndarray:
    """(N,) d ln(compute time) / d ln(batch) of each worker over the octave above its ``local_batch``
    (the octave below at the top of its range), from ``spec.compute_curve_s`` interpolated linearly in
    log-log: 1 where a step costs in proportion to its batch (a CPU rank), near 0 where it rides a
    launch or host floor (a GPU at small batches), above 1 past a cache knee. 0 for a worker whose
    range is one batch. Raises ValueError when the spec carries no curve."""
    if spec.compute_curve_s is None:
        raise ValueError(
            "BackendSpec.compute_curve_s is None: the compute elasticity needs the workers' compute curve "
            "(the simulator fills it; on real ranks run the quick calibration first, calibrate.quick=true)"
        )
    lo = np.log(spec.min_batch.astype(np.float64))
    hi = np.log(spec.max_batch.astype(np.float64))
    return loglog_elasticity(lo, hi, np.log(spec.compute_curve_s), local_batch)


def loglog_elasticity(
    lo: np.ndarray, hi: np.ndarray, log_t: np.ndarray, local_batch: np.ndarray
) -> np.ndarray:
    """:func:`compute_elasticity` on precomputed logs: ``lo``, ``hi`` (N,) the log batch range, ``log_t``
    (N, G) the log curve on G log-spaced points (vectorised over workers)."""
    g = log_t.shape[1]
    width = hi - lo
    one = width > 1e-9
    safe = np.where(one, width, 1.0)
    octave = np.log(2.0)
    x = np.clip(np.log(np.maximum(np.asarray(local_batch, dtype=np.float64), 1.0)), lo, hi)
    b = np.minimum(x + octave, hi)
    a = np.where(b - x < 0.5 * octave, np.maximum(b - octave, lo), x)
    rows = np.arange(len(lo))

    def at(v: np.ndarray) -> np.ndarray:
        u = (v - lo) / safe * (g - 1)
        i = np.clip(np.floor(u).astype(np.int64), 0, g - 2)
        f = u - i
        return log_t[rows, i] * (1.0 - f) + log_t[rows, i + 1] * f

    span = b - a
    return np.where(one & (span > 1e-9), (at(b) - at(a)) / np.where(span > 1e-9, span, 1.0), 0.0)


@runtime_checkable
class Backend(Protocol):
    """A training system the env can drive."""

    spec: BackendSpec

    def reset(self, seed: int | None = None, *, rng: np.random.Generator | None = None) -> None:
        """Start a fresh training run (fresh model, clock at zero)."""

    def run_interval(self, local_batches: np.ndarray, iterations: int) -> IntervalReport:
        """Run ``iterations`` synchronous iterations at ``local_batches`` (one per worker)."""

    def close(self) -> None:
        """Release processes and resources; safe to call twice."""


@runtime_checkable
class GroundTruth(Protocol):
    """The simulator's noise-free models at its current fault state, for oracles (simulation only).

    A simulated backend exposes one as ``backend.ground_truth`` (real backends have none) and the
    env hands it on as ``info["ground_truth"]``. It is a live view of the backend: ask it about the
    interval just reported, before the next step.
    """

    def compute_time_s(self, local_batches: np.ndarray) -> np.ndarray:
        """Noise-free compute time per worker (s) at ``local_batches`` (the last axis: workers)."""

    def iteration_time_s(self, local_batches: np.ndarray) -> float:
        """Noise-free iteration time (s) at ``local_batches``, communication included."""

    def progress_per_step(self, global_batch: float, progress: float) -> float:
        """Training progress (base-batch steps) one step at ``global_batch`` makes at ``progress``."""

    def progress_to_target(self, global_batches: np.ndarray, quality: float | None = None) -> np.ndarray:
        """Progress at which the true validation quality would reach the target (or ``quality``) if
        each of ``global_batches`` were held from now on (the accuracy model's batch memory moving
        toward it); ``inf`` where it never would."""

    def validation_sd(self, quality: float) -> float:
        """The standard deviation of the measured validation quality around a true ``quality``."""

    # Optional (an oracle reads it with getattr; a backend without instability may leave it out):
    # def collapse_risk(self, global_batches: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    #     per global batch, the chance the next interval collapses there, the share of progress a
    #     collapse loses, and whether training would stay stuck there (SimGroundTruth's docstring)

    @property
    def reconfig_delay_s(self) -> float:
        """The pause an interval pays when any local batch changes at its start (s)."""

    @property
    def interval_overhead_s(self) -> float:
        """The fixed wall time every interval costs besides its iterations (s)."""
