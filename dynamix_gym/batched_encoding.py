"""Observation (schema 1), noise-scale estimate and reward for a batch of clusters at once.

The vector envs (:mod:`dynamix_gym.envs.batched_vector`, :mod:`dynamix_gym.envs.batched_per_worker`)
step many simulated clusters as arrays (:mod:`sim.batched`); encoding each cluster's report through
:class:`dynamix_gym.obs.v1.ObservationEncoder` and :func:`dynamix_gym.reward.compute_reward` one at a
time would cost more than the simulation. :class:`BatchedEncoder` and :func:`batched_reward` compute
the same features and terms over arrays ``[clusters, workers]`` of a
:class:`sim.batched.BatchReport` (padded workers masked out). The equations are those modules'
(their docstrings hold them); ``tests/dynamix_gym/envs/test_batched_vector.py`` checks the results
against them cluster by cluster.
"""

from __future__ import annotations

import numpy as np

from dynamix_gym.obs import OBS_SCHEMA
from dynamix_gym.obs.v1 import GLOBAL_FEATURES, WORKER_FEATURES
from dynamix_gym.reward import RewardConfig
from dynamix_gym.stats import MAX_NOISE_SCALE
from sim.batched import BatchReport

_W_LOW = np.array([f.low for f in WORKER_FEATURES])
_W_HIGH = np.array([f.high for f in WORKER_FEATURES])
_G_LOW = np.array([f.low for f in GLOBAL_FEATURES])
_G_HIGH = np.array([f.high for f in GLOBAL_FEATURES])
_FW, _FG = len(WORKER_FEATURES), len(GLOBAL_FEATURES)
_SPEED_RATIO_DEAD = _W_LOW[[f.name for f in WORKER_FEATURES].index("speed_ratio")]


def _masked_mean(x: np.ndarray, mask: np.ndarray, count: np.ndarray) -> np.ndarray:
    return np.where(mask, x, 0.0).sum(axis=1) / np.maximum(count, 1)


class BatchedNoiseScale:
    """:class:`dynamix_gym.stats.NoiseScaleEstimator` (two-batch estimates, EMA) per cluster."""

    def __init__(self, clusters: int, smoothing: float = 0.2) -> None:
        self.smoothing = smoothing
        self.grad_sqr = np.full(clusters, np.nan)  # nan: no estimate yet
        self.trace_sigma = np.full(clusters, np.nan)

    def reset(self, rows: np.ndarray) -> None:
        self.grad_sqr[rows] = np.nan
        self.trace_sigma[rows] = np.nan

    def update(self, rows: np.ndarray, r: BatchReport, live: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Fold in the reports of clusters ``rows``; their noise-scale estimates (nan: none yet)."""
        b = np.where(live, r.local_batch, 1).astype(np.float64)
        x = np.where(live, 1.0 / b, 0.0)
        y = np.where(live, r.local_grad_sqr, 0.0)
        gb = r.global_batch
        ok = (n > 0) & (gb > 0)
        xg = 1.0 / np.maximum(gb, 1)
        yg = r.global_grad_sqr
        sx, sy = x.sum(axis=1), y.sum(axis=1)
        w = 2.0 * n
        with np.errstate(invalid="ignore", divide="ignore"):
            xm = (sx + n * xg) / w
            ym = (sy + n * yg) / w
            sxx = (x * x).sum(axis=1) - 2.0 * xm * sx + n * xm * xm + n * (xg - xm) ** 2
            ok &= ~(sxx <= 1e-12 * np.maximum(xm * xm, 1e-300))
            sxy = (x * y).sum(axis=1) - xm * sy - ym * sx + n * xm * ym + n * (xg - xm) * (yg - ym)
            s = sxy / sxx
        g2 = ym - s * xm
        cur_g, cur_s = self.grad_sqr[rows], self.trace_sigma[rows]
        first = np.isnan(cur_g)
        a = self.smoothing
        new_g = np.where(first, g2, cur_g + a * (g2 - cur_g))
        new_s = np.where(first, s, cur_s + a * (s - cur_s))
        self.grad_sqr[rows] = np.where(ok, new_g, cur_g)
        self.trace_sigma[rows] = np.where(ok, new_s, cur_s)
        g, t = self.grad_sqr[rows], self.trace_sigma[rows]
        with np.errstate(invalid="ignore", divide="ignore"):
            bn = np.where(t <= 0, 1.0, np.where(g <= t / MAX_NOISE_SCALE, MAX_NOISE_SCALE, t / g))
        return np.where(np.isnan(g), np.nan, bn)


class BatchedEncoder:
    """:class:`dynamix_gym.obs.v1.ObservationEncoder` (schema 1) for ``clusters`` clusters of up to
    ``width`` workers; per-cluster facts (batch ranges, target, budget, classes) set by :meth:`set`.

    :meth:`encode` returns the per-worker features ``[C, W, 19]`` and the global ones ``[C, 13]``,
    normalised onto [-1, 1] (float32); the centralised observation of a cluster of ``W`` workers is
    the first reshaped to ``W * 19`` followed by the second.
    """

    schema = OBS_SCHEMA

    def __init__(self, clusters: int, width: int, window: int = 4, noise_smoothing: float = 0.2) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        c, w = clusters, width
        self.window = window
        self.noise = BatchedNoiseScale(c, noise_smoothing)
        self.log2_max, self.log2_min = np.zeros((c, w)), np.zeros((c, w))
        self.valid = np.zeros((c, w), dtype=bool)
        self.base_batch, self.target, self.budget, self.log_classes = (np.ones(c) for _ in range(4))
        self._batch_hist = np.zeros((c, window + 1, w))
        self._val_hist = np.zeros((c, window + 1))
        self._count = np.zeros(c, dtype=np.int64)
        self._head = np.zeros(c, dtype=np.int64)
        self._w_scale = 2.0 / (_W_HIGH - _W_LOW)
        self._w_offset = -1.0 - _W_LOW * self._w_scale
        self._g_scale = 2.0 / (_G_HIGH - _G_LOW)
        self._g_offset = -1.0 - _G_LOW * self._g_scale

    def set(self, row: int, spec, time_budget_s: float) -> None:
        """Cluster ``row`` is ``spec``'s (a :class:`sim.protocol.BackendSpec`) from now on."""
        n = spec.num_workers
        self.valid[row] = False
        self.valid[row, :n] = True
        self.log2_max[row] = self.log2_min[row] = 0.0
        self.log2_max[row, :n] = np.log2(spec.max_batch.astype(np.float64))
        self.log2_min[row, :n] = np.log2(spec.min_batch.astype(np.float64))
        self.base_batch[row] = spec.base_batch
        self.target[row] = spec.target_accuracy
        self.budget[row] = time_budget_s
        self.log_classes[row] = np.log(spec.num_classes)

    def reset(self, rows: np.ndarray) -> None:
        self.noise.reset(rows)
        self._count[rows] = 0

    def _history(self, rows, hist, current):
        """Append ``current`` to each row's ring of ``window + 1``; the oldest entry held."""
        size = self.window + 1
        head = (self._head[rows] + (self._count[rows] > 0)) % size
        hist[rows, head] = current
        count = np.minimum(self._count[rows] + 1, size)
        return hist[rows, (head - count + 1) % size], head, count

    def encode(self, rows: np.ndarray, r: BatchReport) -> tuple[np.ndarray, np.ndarray]:
        """Consume the reports of clusters ``rows`` (``r``'s rows in that order)."""
        valid = self.valid[rows]
        live = r.alive & valid
        n_live = live.sum(axis=1)
        bn = self.noise.update(rows, r, live, n_live)
        old_batch, head, count = self._history(rows, self._batch_hist, r.batch_accuracy)
        old_val, _, _ = self._history(rows, self._val_hist, r.val_accuracy)
        self._head[rows], self._count[rows] = head, count
        interval = np.maximum(r.interval_time_s, 1e-9)

        b = np.where(valid, r.local_batch, 1).astype(np.float64)
        it = np.maximum(r.iteration_time_s, 1e-9)
        comp = np.maximum(r.compute_time_s, 1e-9)
        raw = np.empty((_FW, len(rows), b.shape[1]))  # feature-major: each write contiguous
        raw[0] = np.log10(np.maximum(r.net_bytes_per_s * 1e-6 + 1.0, 0.0))
        raw[1] = np.log10(np.maximum(r.tcp_retransmissions / interval[:, None] + 1.0, 0.0))
        raw[2], raw[3] = r.cpu_util, r.mem_util
        raw[4], raw[5] = np.log10(it), np.log10(comp)
        idle_frac = r.idle_time_s / it
        log_b = np.log2(b)
        raw[6], raw[7] = idle_frac, log_b
        raw[8] = r.batch_accuracy
        raw[9] = r.batch_accuracy - old_batch
        raw[10] = np.log10(np.maximum(r.grad_norm_mean, 1e-12))
        raw[11] = np.log10(np.maximum(r.grad_norm_var + 1e-12, 0.0))
        rate = b / comp
        any_live = n_live > 0
        mean_b = np.where(any_live, _masked_mean(b, live, n_live), 1.0)
        mean_rate = np.where(any_live, _masked_mean(rate, live, n_live), 1.0)
        slowest = np.where(any_live, np.where(live, comp, -np.inf).max(axis=1), 1.0)
        iter_mean = np.where(any_live, _masked_mean(it, live, n_live), 1.0)
        mean_idle = np.where(any_live, _masked_mean(idle_frac, live, n_live), 0.0)
        raw[12] = comp / slowest[:, None]
        raw[13] = log_b - np.log2(np.maximum(mean_b, 1e-12))[:, None]
        raw[14] = np.log2(rate) - np.log2(np.maximum(mean_rate, 1e-12))[:, None]
        raw[15] = self.log2_max[rows] - log_b
        raw[16] = log_b - self.log2_min[rows]
        raw[17], raw[18] = r.gpu_util, live
        dead = ~live
        if dead.any():
            raw[6][dead] = 0.0
            raw[12][dead] = 0.0
            raw[14][dead] = _SPEED_RATIO_DEAD

        m = np.maximum(r.global_batch, 1).astype(np.float64)
        base = self.base_batch[rows]
        bn = np.where(np.isnan(bn), base, bn)
        glob = np.empty((len(rows), _FG))
        glob[:, 0] = r.val_accuracy
        glob[:, 1] = r.val_loss / self.log_classes[rows]
        glob[:, 2] = self.target[rows] - r.val_accuracy
        glob[:, 3] = r.val_accuracy - old_val
        glob[:, 4] = np.log2(m)
        glob[:, 5] = np.log10(np.maximum(bn, 1.0))
        glob[:, 6] = np.log2(np.maximum(bn, 1e-9) / m)
        glob[:, 7] = (bn + base) / (bn + m)
        glob[:, 8] = r.wall_time_s / self.budget[rows]
        glob[:, 9] = np.minimum(r.comm_time_s / iter_mean, 1.0)
        glob[:, 10] = mean_idle
        glob[:, 11] = np.log2(np.maximum(n_live, 1))
        glob[:, 12] = np.log10(interval)
        np.clip(raw, _W_LOW[:, None, None], _W_HIGH[:, None, None], out=raw)
        raw *= self._w_scale[:, None, None]
        raw += self._w_offset[:, None, None]
        np.clip(glob, _G_LOW, _G_HIGH, out=glob)
        glob *= self._g_scale
        glob += self._g_offset
        raw[:, ~valid] = 0.0
        worker = np.empty((len(rows), b.shape[1], _FW), dtype=np.float32)
        worker[...] = raw.transpose(1, 2, 0)
        return worker, glob.astype(np.float32)


def batched_reward(
    cfg: RewardConfig, r: BatchReport, valid: np.ndarray, prev_val: np.ndarray, reached: np.ndarray
) -> np.ndarray:
    """:func:`dynamix_gym.reward.compute_reward` of each cluster's report (float64 ``[C]``)."""
    if cfg.kind == "time":
        return -r.interval_time_s / cfg.time_scale_s + np.where(reached, cfg.target_bonus, 0.0)
    live = r.alive & valid
    n_live = live.sum(axis=1)
    # all workers when every one or none is live (as compute_reward reads them)
    use = np.where(((n_live == valid.sum(axis=1)) | (n_live == 0))[:, None], valid, live)
    n = use.sum(axis=1)
    acc = r.val_accuracy
    gain = np.maximum(0.0, acc - prev_val)
    b = np.maximum(np.where(use, r.local_batch, 1), 1).astype(np.float64)
    dev = np.log2(b) - cfg.regulariser_center_log2
    dev = np.abs(dev) if cfg.regulariser == "abs" else dev
    reg = np.where(use, dev, 0.0).sum(axis=1) / n
    var = np.where(use, r.grad_norm_var, 0.0)
    stability = (var + np.sqrt(var)).sum(axis=1) / n
    it = np.where(use, r.iteration_time_s, 0.0).sum(axis=1) / n
    total = acc + cfg.alpha * gain - cfg.beta * it - cfg.delta * reg - cfg.eta * stability
    if not np.all(np.isfinite(total)):
        raise FloatingPointError(
            f"non-finite reward in clusters {np.flatnonzero(~np.isfinite(total)).tolist()}"
        )
    return total
