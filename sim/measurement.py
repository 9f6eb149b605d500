"""What a cluster's counters read at the end of an interval, from the interval's running sums.

One function for both engines: :class:`sim.engine.Simulator` (one cluster: per-worker arrays ``[n]``,
per-cluster sums as scalars) and :class:`sim.batched.BatchedSimulator` (arrays ``[clusters, workers]``,
per-cluster sums as arrays ``[clusters]``), so that the two cannot drift apart. Per worker i, with
``iters_i`` the iterations it took part in, ``T_train`` the interval's training time, ``T_wall`` its
wall time (training, stalls, reconfiguration, overhead) and ``e_r`` the r-th lognormal measurement
noise factor:

    compute_time_s_i   = sum T_compute_i / iters_i                (0 for a worker that took no part)
    idle_time_s_i      = sum (T_slowest - T_compute_i) / iters_i
    iteration_time_s_i = T_train / K * e_0
    samples_per_s_i    = b_i iters_i / T_wall
    net_bytes_per_s_i  = bytes_i / T_wall * e_1
    cpu_util_i         = clip((host busy_i [+ GPU busy_i when compute runs on the host] + cpu load_i)
                              / T_train * e_2)
    gpu_util_i         = clip(GPU busy_i / T_train * e_3)
    mem_util_i         = clip((host_mem_fixed_i + host_mem_per_sample_i b_i) e_4)
    gpu_mem_util_i     = clip(gpu_mem_fixed_i + gpu_mem_per_sample_i b_i)
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _per_cluster(x: Any) -> np.ndarray:
    """A per-cluster value as a column that broadcasts over the workers (a scalar: shape (1,))."""
    return np.asarray(x)[..., None]


def counters(
    acc: Any,
    b: np.ndarray,
    k_iters: int,
    interval_time_s: Any,
    meas: np.ndarray,
    *,
    compute_on_host: Any,
    host_mem: tuple[np.ndarray, np.ndarray],
    gpu_mem: tuple[np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """The per-worker counters of an interval (the fields of :class:`sim.protocol.IntervalReport`
    named as the keys returned, ``alive`` the workers that took part).

    Args:
        acc: the interval's sums: per worker ``compute``, ``idle``, ``gpu_busy``, ``host_busy``,
            ``cpu_load``, ``iters_alive``, ``bytes_sent`` (``[..., W]``); per cluster ``iter_time``
            (the training time: a scalar or ``[C]``).
        b: local batches ``[..., W]``.
        k_iters: iterations of the interval (K).
        interval_time_s: the interval's wall time (a scalar or ``[C]``).
        meas: lognormal measurement noise factors ``[..., 5, W]``.
        compute_on_host: whether compute runs on the host (a bool or ``[C]``).
        host_mem: (fixed, per sample) host-memory fractions ``[..., W]``.
        gpu_mem: (fixed, per sample) GPU-memory fractions ``[..., W]``.
    """
    took_part = acc.iters_alive > 0
    per = np.where(took_part, acc.iters_alive, 1.0)
    iter_time = _per_cluster(acc.iter_time)
    train_time = np.maximum(iter_time, 1e-12)
    wall = np.maximum(_per_cluster(interval_time_s), 1e-12)
    host_busy = np.where(_per_cluster(compute_on_host), acc.host_busy + acc.gpu_busy, acc.host_busy)
    return {
        "alive": took_part,
        "compute_time_s": np.where(took_part, acc.compute / per, 0.0),
        "idle_time_s": np.where(took_part, acc.idle / per, 0.0),
        "iteration_time_s": np.where(took_part, iter_time / k_iters * meas[..., 0, :], 0.0),
        "samples_per_s": b * acc.iters_alive / wall,
        "net_bytes_per_s": acc.bytes_sent / wall * meas[..., 1, :],
        "cpu_util": np.clip((host_busy + acc.cpu_load) / train_time * meas[..., 2, :], 0.0, 1.0),
        "gpu_util": np.clip(acc.gpu_busy / train_time * meas[..., 3, :], 0.0, 1.0),
        "mem_util": np.clip((host_mem[0] + host_mem[1] * b) * meas[..., 4, :], 0.0, 1.0),
        "gpu_mem_util": np.clip(gpu_mem[0] + gpu_mem[1] * b, 0.0, 1.0),
    }
