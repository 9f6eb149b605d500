"""The interval report: what every training backend measures over one decision interval.

It is deliberately plain (numpy arrays and floats, no simulator types), so that the simulator and
the real PyTorch DDP adapter fill the same record, and the env's observation encoding, reward and
every controller read only this. ``truth`` is the simulator's hidden state (``None`` on real
backends); only oracles and tests may read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

#: Per-worker fields (arrays of shape (num_workers,)), in a stable order.
WORKER_FIELDS: tuple[str, ...] = (
    "local_batch",
    "alive",
    "iteration_time_s",
    "compute_time_s",
    "idle_time_s",
    "samples_per_s",
    "net_bytes_per_s",
    "tcp_retransmissions",
    "cpu_util",
    "mem_util",
    "gpu_util",
    "gpu_mem_util",
    "batch_accuracy",
    "batch_loss",
    "grad_norm_mean",
    "grad_norm_var",
    "local_grad_sqr",
)


@dataclass(frozen=True, eq=False)
class IntervalReport:
    """Measurements of one interval of ``iterations`` synchronous data-parallel iterations.

    Per-worker arrays (shape ``(num_workers,)``) hold means over the interval's iterations unless
    stated otherwise. Utilisations are fractions in [0, 1].
    """

    # --- per worker ---
    local_batch: np.ndarray  # int64: the local batch each worker ran
    alive: np.ndarray  # bool: worker took part in the interval
    iteration_time_s: np.ndarray  # wall time per iteration seen by the worker
    compute_time_s: np.ndarray  # input pipeline + forward + backward per iteration
    idle_time_s: np.ndarray  # waiting for the slowest worker at the barrier, per iteration
    samples_per_s: np.ndarray  # local samples per second of wall time
    net_bytes_per_s: np.ndarray  # gradient traffic sent by the worker, bytes/s
    tcp_retransmissions: np.ndarray  # TCP segments retransmitted during the interval (count)
    cpu_util: np.ndarray
    mem_util: np.ndarray  # host memory
    gpu_util: np.ndarray  # fraction of wall time the device computed
    gpu_mem_util: np.ndarray  # device memory (0 on CPU backends)
    batch_accuracy: np.ndarray  # training-batch accuracy over the interval
    batch_loss: np.ndarray
    grad_norm_mean: np.ndarray  # mean of the local gradient norm |g_i| over iterations
    grad_norm_var: np.ndarray  # variance of |g_i| over iterations
    local_grad_sqr: np.ndarray  # mean |g_i|^2 of the local (batch b_i) gradient
    # --- global ---
    iterations: int
    interval_time_s: float  # wall time of the interval, reconfiguration included
    wall_time_s: float  # wall clock since the run started, at the end of the interval
    reconfig_time_s: float  # time spent applying batch changes at the start of the interval
    comm_time_s: float  # exposed (non-overlapped) all-reduce per iteration
    global_batch: int
    global_grad_sqr: float  # mean |g|^2 of the all-reduced gradient (batch = global_batch)
    val_accuracy: float
    val_loss: float
    samples: int  # samples processed during the interval
    epoch: float  # epochs of the training set completed so far
    events: tuple[str, ...] = ()  # faults or failures that started or ended during the interval
    truth: Mapping[str, Any] | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        """Field-by-field equality (arrays elementwise; in ``truth``, callables are skipped)."""
        if not isinstance(other, IntervalReport):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "truth":
                if (a is None) != (b is None):
                    return False
                if a is not None:
                    a = {k: v for k, v in a.items() if not callable(v)}
                    b = {k: v for k, v in b.items() if not callable(v)}
                    if a.keys() != b.keys() or not all(np.array_equal(a[k], b[k]) for k in a):
                        return False
            elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not np.array_equal(a, b):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self):
        # Pickling (e.g. across SubprocVecEnv pipes) keeps the data and drops the ground-truth
        # callables, which hold the live simulator.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.truth is not None:
            state["truth"] = {k: v for k, v in self.truth.items() if not callable(v)}
        return (_rebuild_report, (state,))

    def __deepcopy__(self, memo: dict) -> IntervalReport:
        # Reports are immutable records (vectorised envs deep-copy infos every step): share them.
        return self

    def __copy__(self) -> IntervalReport:
        return self

    @property
    def num_workers(self) -> int:
        return int(self.local_batch.shape[0])

    def worker_arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in WORKER_FIELDS}

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
        for name in (
            "interval_time_s",
            "wall_time_s",
            "comm_time_s",
            "global_grad_sqr",
            "val_accuracy",
            "val_loss",
        ):
            v = float(getattr(self, name))
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"IntervalReport.{name} must be finite and >= 0, got {v}")


def _rebuild_report(state: dict[str, Any]) -> IntervalReport:
    return IntervalReport(**state)
