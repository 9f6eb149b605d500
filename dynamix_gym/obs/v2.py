"""Observation schema 2: scale-free features, so that different workloads look alike where their
decisions are alike.

Schema 1 (:mod:`dynamix_gym.obs.v1`) reads absolute quantities: log10 seconds, log2 samples,
log10 gradient norms, MB/s. A policy trained on CIFAR-10 therefore sees BERT (batch 4..36,
seconds-long iterations, gradient norms of 1e8) or NCF (batch 16..32768, millisecond compute) as
out-of-distribution inputs. Schema 2 expresses every feature against a scale the job itself
provides, so that only decision-relevant structure is left:

* batches against the worker's own [min, max] range (in octaves), the cluster's mean local batch
  and the gradient-noise-scale estimate;
* times against the cluster's current mean or the run's first interval (the warm-up interval);
* throughput, network traffic and gradient statistics as ratios to the cluster's mean or trends
  against the run's first interval; retransmissions as a fraction of the segments sent;
* validation progress as the fraction of the way from the first interval's quality to the target.

Dropped from schema 1 because they carry a workload's scale and no decision: absolute times,
batches, bytes and gradient norms, host memory, training-batch accuracy, the loss in ln(C) units,
the statistical efficiency against the workload's base batch and the (absolute) worker count.

Per-worker observation: ``self.*`` then ``global.*`` (:data:`OBS_SCHEMA_V2`).
Its table, generated from the features at import (the docs' observation reference shows it too):

A dead worker (``alive`` false) reads 0 for compute share, idle fraction and CPU change, and the
lowest value of speed ratio and trend, network share and the three gradient-norm features; means
are over live workers. A reference ("first") value is taken from the first interval in which it is
defined (a worker's first live interval; the first noise-scale estimate below
:data:`~dynamix_gym.stats.MAX_NOISE_SCALE`: while the gradient noise dwarfs the batch, the
two-batch estimate of |G|^2 is at or below 0 and the estimate sits at that cap); until then its
trend reads 0. Before the first noise-scale estimate the workload's base batch stands in for it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from dynamix_gym.obs.base import EncoderBase, Feature, ObservationSchema, with_table
from dynamix_gym.stats import MAX_NOISE_SCALE
from sim.network import TCP_MSS_BYTES
from sim.protocol import BackendSpec, IntervalReport

SCHEMA_VERSION_V2 = "2"

WORKER_FEATURES_V2: tuple[Feature, ...] = (
    Feature(
        "batch_position", "fraction", 0.0, 1.0, "(log2 b - log2 min) / (log2 max - log2 min); 0 if min = max"
    ),
    Feature("batch_ratio", "log2(ratio)", -6.0, 6.0, "local batch / mean live local batch"),
    Feature("speed_ratio", "log2(ratio)", -6.0, 6.0, "compute samples/s / mean over live workers"),
    Feature(
        "speed_trend",
        "log2(ratio)",
        -4.0,
        4.0,
        "compute samples/s / its value in the worker's first live interval",
    ),
    Feature("compute_share", "fraction", 0.0, 1.0, "compute time / slowest live worker's compute time"),
    Feature("idle_fraction", "fraction", 0.0, 1.0, "share of the iteration spent waiting at the barrier"),
    Feature("gpu_util", "fraction", 0.0, 1.0, "device busy fraction"),
    Feature(
        "cpu_util_change",
        "fraction",
        -1.0,
        1.0,
        "host CPU utilisation minus its value in the worker's first live interval",
    ),
    Feature("net_share", "log2(ratio)", -6.0, 6.0, "gradient bytes/s sent / mean over live workers"),
    Feature(
        "retransmit_rate",
        "log10(fraction)",
        -6.0,
        0.0,
        "retransmitted / sent TCP segments (1448-byte segments), floored at 1e-6",
    ),
    Feature("grad_norm_ratio", "log2(ratio)", -4.0, 4.0, "mean local gradient norm / mean over live workers"),
    Feature(
        "grad_norm_cv", "log10(ratio)", -4.0, 1.0, "std / mean of the local gradient norm, floored at 1e-6"
    ),
    Feature(
        "grad_norm_trend",
        "log2(ratio)",
        -6.0,
        6.0,
        "mean local gradient norm / its value in the worker's first live interval",
    ),
    Feature("alive", "flag", 0.0, 1.0, "1 if the worker took part in the interval"),
)

GLOBAL_FEATURES_V2: tuple[Feature, ...] = (
    Feature("progress", "fraction", -0.5, 1.5, "(quality - first quality) / (target - first quality)"),
    Feature(
        "progress_gain",
        "fraction",
        -0.5,
        0.5,
        "quality gain over `window` intervals / (target - first quality)",
    ),
    Feature("val_loss_trend", "log2(ratio)", -8.0, 2.0, "validation loss / first interval's"),
    Feature("noise_to_batch", "log2(ratio)", -12.0, 12.0, "noise-scale estimate / global batch"),
    Feature(
        "noise_scale_trend",
        "log2(ratio)",
        -8.0,
        8.0,
        "noise-scale estimate / the run's first unsaturated estimate",
    ),
    Feature(
        "global_batch_position",
        "fraction",
        0.0,
        1.0,
        "global batch in octaves between the live workers' summed min and max",
    ),
    Feature("time_used", "fraction", 0.0, 1.5, "wall time / episode time budget"),
    Feature(
        "interval_time_trend", "log2(ratio)", -8.0, 8.0, "interval wall time / the run's first interval's"
    ),
    Feature(
        "iteration_time_trend",
        "log2(ratio)",
        -6.0,
        6.0,
        "mean live iteration time / the run's first interval's",
    ),
    Feature(
        "throughput_trend", "log2(ratio)", -6.0, 6.0, "samples/s of the interval / the run's first interval's"
    ),
    Feature("throughput_gain", "log2(ratio)", -4.0, 4.0, "samples/s / its value `window` intervals ago"),
    Feature("comm_fraction", "fraction", 0.0, 1.0, "exposed all-reduce / mean live iteration time"),
    Feature("mean_idle_fraction", "fraction", 0.0, 1.0, "idle fraction averaged over live workers"),
    Feature(
        "reconfig_fraction", "fraction", 0.0, 1.0, "batch-change (reconfiguration) time / interval wall time"
    ),
    Feature("live_fraction", "fraction", 0.0, 1.0, "live workers / workers"),
)

OBS_SCHEMA_V2 = ObservationSchema(SCHEMA_VERSION_V2, WORKER_FEATURES_V2, GLOBAL_FEATURES_V2)
__doc__ = with_table(__doc__, OBS_SCHEMA_V2)

_FW, _FG = len(WORKER_FEATURES_V2), len(GLOBAL_FEATURES_V2)
_W = {f.name: i for i, f in enumerate(WORKER_FEATURES_V2)}
#: Columns a dead worker reads at their lowest value (and the two that read 0).
_DEAD_LOW = [
    _W[k]
    for k in (
        "speed_ratio",
        "speed_trend",
        "net_share",
        "grad_norm_ratio",
        "grad_norm_cv",
        "grad_norm_trend",
    )
]
_DEAD_LOW_VALUES = np.array([WORKER_FEATURES_V2[i].low for i in _DEAD_LOW])
_DEAD_ZERO = [_W["compute_share"], _W["idle_fraction"], _W["cpu_util_change"]]
_PROGRESS_SPAN_FLOOR = 0.01  # a first quality within 1 % of the target still gives a finite progress


class ScaleFreeEncoder(EncoderBase):
    """Observation schema 2 (:data:`OBS_SCHEMA_V2`) from interval reports; keeps the run's first
    values and a short history. Same interface as :class:`dynamix_gym.obs.v1.ObservationEncoder`.

    Args:
        spec: the backend's spec (limits, target, budget).
        window: intervals over which progress and throughput gains are measured.
        noise_smoothing: EMA weight of the noise-scale estimator.
    """

    schema = OBS_SCHEMA_V2

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        super().__init__(spec, window, noise_smoothing)
        n = spec.num_workers
        self._min = spec.min_batch.astype(np.float64)
        self._max = spec.max_batch.astype(np.float64)
        self._log2_min = np.log2(self._min)
        width = np.log2(self._max) - self._log2_min
        self._inv_width = np.divide(1.0, width, out=np.zeros(n), where=width > 0)
        self._min_list, self._max_list = self._min.tolist(), self._max.tolist()
        # (field, worker) rows of the logged inputs: compute rate, gradient norm and bytes sent.
        # A later schema appends global features after schema 2's (3: ``_extra_globals``) and worker
        # features after schema 2's (4: ``_extra_workers``).
        g_features, w_features = self.schema.global_features, self.schema.worker_features
        self._fw = fw = len(w_features)
        self._flat = np.empty(n * fw + len(g_features))
        self._raw = self._flat[: n * fw].reshape(n, fw)
        low = np.array([f.low for f in w_features])
        high = np.array([f.high for f in w_features])
        g_low = np.array([f.low for f in g_features])
        g_high = np.array([f.high for f in g_features])
        self._low = np.concatenate([np.tile(low, n), g_low])
        self._high = np.concatenate([np.tile(high, n), g_high])
        scale = 2.0 / (self._high - self._low)
        self._scale, self._offset = scale, -1.0 - self._low * scale
        self.reset()

    def reset(self) -> None:
        n = self.spec.num_workers
        self.noise.reset()
        self._val_q: deque[float] = deque(maxlen=self.window + 1)
        self._tput: deque[float] = deque(maxlen=self.window + 1)
        # Per-worker first values (log2 rate, cpu, log2 grad norm); NaN until the worker is live.
        self._ref = np.full((3, n), np.nan)
        self._ref_complete = False
        self._q0: float | None = None
        self._loss0 = self._interval0 = self._it0 = self._tput0 = self._bn0 = None

    def encode(self, report: IntervalReport) -> np.ndarray:
        """Consume one report; return the centralised observation (float32, a new array)."""
        spec = self.spec
        bn = self.noise.update(report)
        live = report.alive
        live_list = live.tolist()
        all_live = False not in live_list
        n = len(live_list)
        raw = self._raw
        if raw.shape[0] != n:
            raise ValueError(f"the report has {n} workers, the encoder's spec {raw.shape[0]}")
        interval = max(report.interval_time_s, 1e-9)

        # (field, worker) rows, floored where a log or a division follows.
        x = np.array(
            [
                report.compute_time_s,
                report.iteration_time_s,
                report.grad_norm_mean,
                report.net_bytes_per_s,
                report.local_batch,
                report.idle_time_s,
                report.cpu_util,
                report.gpu_util,
                report.grad_norm_var,
                report.tcp_retransmissions,
            ],
            dtype=np.float64,
        )
        np.maximum(x[0:2], 1e-9, out=x[0:2])
        np.maximum(x[2:4], 1e-12, out=x[2:4])
        comp, it, gnorm, net, b = x[0], x[1], x[2], x[3], x[4]
        # log2 of compute rate, gradient norm, bytes sent and batch in one call.
        logs = np.log2(np.array([b / comp, gnorm, net, b]))
        log_rate, log_g, log_net, log_b = logs
        idle_frac = x[5] / it

        if all_live:
            n_live = n
            mean_b = sum(b.tolist()) / n
            mean_rate = sum((b / comp).tolist()) / n
            mean_g, mean_net = sum(gnorm.tolist()) / n, sum(net.tolist()) / n
            slowest, iter_mean = max(comp.tolist()), sum(it.tolist()) / n
            mean_idle = sum(idle_frac.tolist()) / n
            lo_sum, hi_sum = sum(self._min_list), sum(self._max_list)
        else:
            n_live = n - live_list.count(False)
            if n_live:
                mean_b, mean_rate = float(b[live].mean()), float((b / comp)[live].mean())
                mean_g, mean_net = float(gnorm[live].mean()), float(net[live].mean())
                slowest, iter_mean = float(comp[live].max()), float(it[live].mean())
                mean_idle = float(idle_frac[live].mean())
                lo_sum, hi_sum = float(self._min[live].sum()), float(self._max[live].sum())
            else:
                mean_b = mean_rate = mean_g = mean_net = slowest = iter_mean = 1.0
                mean_idle, lo_sum, hi_sum = 0.0, 1.0, 1.0

        # Per-worker first values, taken in the worker's first live interval.
        ref = self._ref
        if not self._ref_complete:
            new = live & np.isnan(ref[0])
            ref[0, new], ref[1, new], ref[2, new] = log_rate[new], x[6, new], log_g[new]
            self._ref_complete = not np.isnan(ref[0]).any()
            ref_ok = ~np.isnan(ref[0])
            ref_filled = np.where(ref_ok, ref, np.array([log_rate, x[6], log_g]))
        else:
            ref_filled = ref

        np.subtract(log_b, self._log2_min, out=raw[:, 0])
        raw[:, 0] *= self._inv_width
        np.subtract(log_b, math.log2(mean_b), out=raw[:, 1])
        np.subtract(log_rate, math.log2(mean_rate), out=raw[:, 2])
        np.subtract(log_rate, ref_filled[0], out=raw[:, 3])
        np.divide(comp, slowest, out=raw[:, 4])
        raw[:, 5] = idle_frac
        raw[:, 6] = x[7]
        np.subtract(x[6], ref_filled[1], out=raw[:, 7])
        np.subtract(log_net, math.log2(mean_net), out=raw[:, 8])
        # retransmitted / sent segments; at least one segment counts as sent
        sent_segments = np.maximum(net * interval / TCP_MSS_BYTES, 1.0)
        np.log10(np.maximum(x[9] / sent_segments, 1e-6), out=raw[:, 9])
        np.subtract(log_g, math.log2(mean_g), out=raw[:, 10])
        np.log10(np.maximum(np.sqrt(x[8]) / gnorm, 1e-6), out=raw[:, 11])
        np.subtract(log_g, ref_filled[2], out=raw[:, 12])
        raw[:, 13] = live
        if self._fw > _FW:
            raw[:, _FW:] = self._extra_workers(b)
        if not all_live:
            dead = ~live
            raw[np.ix_(dead, _DEAD_LOW)] = _DEAD_LOW_VALUES
            raw[np.ix_(dead, _DEAD_ZERO)] = 0.0

        # Run-level first values.
        q = float(report.val_accuracy)
        loss = max(float(report.val_loss), 1e-12)
        tput = max(report.samples / interval, 1e-12)
        if self._q0 is None:
            self._q0, self._loss0, self._interval0 = q, loss, interval
        if self._it0 is None and n_live:
            self._it0 = iter_mean
        if self._tput0 is None and report.samples > 0:
            self._tput0 = tput
        if self._bn0 is None and bn is not None and bn < MAX_NOISE_SCALE:
            self._bn0 = max(bn, 1e-9)
        self._val_q.append(q)
        self._tput.append(tput)
        span = max(spec.target_accuracy - self._q0, _PROGRESS_SPAN_FLOOR)
        m = max(report.global_batch, 1)
        bn_value = max(bn if bn is not None else float(spec.base_batch), 1e-9)
        if n_live and hi_sum > lo_sum:
            g_pos = (math.log2(m) - math.log2(lo_sum)) / (math.log2(hi_sum) - math.log2(lo_sum))
        else:
            g_pos = 0.0
        fw = self._fw
        self._flat[n * fw : n * fw + _FG] = (
            (q - self._q0) / span,
            (q - self._val_q[0]) / span,
            math.log2(loss / self._loss0),
            math.log2(bn_value / m),
            math.log2(bn_value / self._bn0) if self._bn0 is not None else 0.0,
            g_pos,
            report.wall_time_s / spec.time_budget_s,
            math.log2(interval / self._interval0),
            math.log2(iter_mean / self._it0) if self._it0 is not None and n_live else 0.0,
            math.log2(tput / self._tput0) if self._tput0 is not None else 0.0,
            math.log2(tput / self._tput[0]),
            min(report.comm_time_s / iter_mean, 1.0),
            mean_idle,
            min(report.reconfig_time_s / interval, 1.0),
            n_live / n,
        )
        self._flat[n * fw + _FG :] = self._extra_globals(m)
        flat = self._flat
        np.maximum(flat, self._low, out=flat)
        np.minimum(flat, self._high, out=flat)
        flat *= self._scale
        flat += self._offset
        return flat.astype(np.float32)

    def _extra_globals(self, global_batch: int) -> tuple[float, ...]:
        """Raw values of the global features a later schema appends (none in schema 2)."""
        return ()

    def _extra_workers(self, local_batch: np.ndarray) -> np.ndarray:
        """(N, extra) raw values of the worker features a later schema appends (none in schema 2)."""
        raise NotImplementedError(f"schema {self.schema.version} appends worker features; encode them")
