"""Splitting a global batch across workers: the arithmetic shared by the baseline controllers.

All functions are pure numpy over per-worker arrays of shape ``(N,)``. A split is feasible when
``sum(lo) <= total <= sum(hi)``; otherwise the nearest feasible split (all at ``lo`` or all at
``hi``) is returned.
"""

from __future__ import annotations

import numpy as np


def fill_to_total(weights: np.ndarray, total: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Split ``total`` in proportion to ``weights``, within [lo, hi] per worker (water-filling).

    Workers pushed against a bound are fixed there and the rest of ``total`` is shared among the
    others in the same proportions, until nothing more is clipped:

        b_i = clip(total_free * w_i / sum_free(w), lo_i, hi_i)

    Args:
        weights: non-negative share of each worker (e.g. its throughput, samples/s).
        total: the global batch to reach (samples).
        lo: per-worker lower bounds (samples).
        hi: per-worker upper bounds (samples).

    Returns:
        Real-valued batches (float64, shape ``(N,)``) summing to ``total`` when feasible.
    """
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    if not np.any(w > 0):
        w = np.ones_like(w)
    b = np.clip(total * w / w.sum(), lo, hi)
    fixed = np.zeros(w.shape, dtype=bool)
    for _ in range(w.size):
        excess = total - b.sum()
        if abs(excess) < 1e-9:
            break
        # Workers that can still move in the direction of the excess.
        free = ~fixed & ((b < hi) if excess > 0 else (b > lo)) & (w > 0)
        if not free.any():
            free = ~fixed & ((b < hi) if excess > 0 else (b > lo))
            if not free.any():
                break
            w = np.where(free, 1.0, w)
        share = w[free] / w[free].sum()
        b[free] = np.clip(b[free] + excess * share, lo[free], hi[free])
        fixed |= (b <= lo) | (b >= hi)
    return b


def round_to_total(batches: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whole batches within [lo, hi] that sum to ``total`` (largest-remainder rounding).

    Args:
        batches: real-valued split (samples).
        total: the integer global batch to reach.
        lo: per-worker integer lower bounds.
        hi: per-worker integer upper bounds.

    Returns:
        int64 batches; their sum is ``total`` when ``sum(lo) <= total <= sum(hi)``, else the
        nearest feasible sum.
    """
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    x = np.clip(np.asarray(batches, dtype=np.float64), lo, hi)
    b = np.clip(np.floor(x).astype(np.int64), lo, hi)
    remainder = x - b
    missing = int(total) - int(b.sum())
    while missing != 0:
        step = 1 if missing > 0 else -1
        room = (b < hi) if step > 0 else (b > lo)
        if not room.any():
            break
        # Largest remainders go up first; smallest remainders come down first.
        order = np.argsort(-remainder if step > 0 else remainder, kind="stable")
        order = order[room[order]][: abs(missing)]
        b[order] += step
        remainder[order] = 0.0 if step > 0 else 1.0
        missing -= step * order.size
    return b


def equal_time_split(
    grid: np.ndarray, times: np.ndarray, totals: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Splits of each global batch in ``totals`` that equalise the workers' predicted times.

    Minimising the slowest worker's time max_i T_i(b_i) subject to sum_i b_i = M, with every T_i
    non-decreasing, is water-filling on a common time T:

        b_i(T) = clip(T_i^{-1}(T), lo_i, hi_i),   T such that sum_i b_i(T) = M

    Args:
        grid: (G,) increasing local batches at which the times are tabulated.
        times: (G, N) predicted time of worker i at local batch grid[g] (seconds).
        totals: (K,) global batches to split.
        lo: (N,) per-worker lower bounds.
        hi: (N,) per-worker upper bounds.

    Returns:
        ``(batches, t_common)``: (K, N) real-valued splits and (K,) the common time T of each.
    """
    grid = np.asarray(grid, dtype=np.float64)
    t = np.maximum.accumulate(np.asarray(times, dtype=np.float64), axis=0)
    # Strictly increasing per column, so that np.interp inverts it.
    t = t + 1e-12 * np.arange(t.shape[0])[:, None]
    totals = np.atleast_1d(np.asarray(totals, dtype=np.float64))
    n = t.shape[1]

    def batches_at(tc: np.ndarray) -> np.ndarray:
        cols = [np.interp(tc, t[:, i], grid) for i in range(n)]
        return np.clip(np.stack(cols, axis=-1), lo, hi)

    # Every b_i(T) is piecewise linear between the tabulated times, so the total is exactly
    # piecewise linear on the union of those times: invert it there.
    t_all = np.unique(t)
    sums = batches_at(t_all).sum(axis=-1)
    tc = np.interp(totals, sums, t_all)
    b = batches_at(tc)
    # Share out the sub-sample residue of flat stretches so that the sums are exact.
    b = np.stack([fill_to_total(np.maximum(bk, 1e-9), m, lo, hi) for bk, m in zip(b, totals, strict=True)])
    return b, tc
