"""Observation schema 1: absolute quantities, DYNAMIX's state (the env's default, and what every
bundle written before schema 2 was trained on).

Per-worker features describe one worker (DYNAMIX's state plus relative quantities that let one
policy serve any cluster size); global features describe the job. Times are in log10 seconds,
batches in log2 samples, gradient norms in log10, traffic in MB/s, so a policy trained on one
workload sees another of a different scale as out of distribution; schemas 2 and 3
(:mod:`dynamix_gym.obs.v2`, :mod:`dynamix_gym.obs.v3`) are scale-free (:data:`OBS_SCHEMA_V1`).
Its table, generated from the features at import (the docs' observation reference shows it too):
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from dynamix_gym.obs.base import EncoderBase, Feature, ObservationSchema, with_table
from sim.protocol import BackendSpec, IntervalReport
from sim.scaling import statistical_efficiency

SCHEMA_VERSION_V1 = "1"

WORKER_FEATURES: tuple[Feature, ...] = (
    Feature("net_throughput", "log10(1 + MB/s)", 0.0, 4.0, "gradient traffic sent by the worker"),
    Feature("tcp_retransmissions", "log10(1 + segments/s)", 0.0, 5.0, "TCP retransmission rate"),
    Feature("cpu_util", "fraction", 0.0, 1.0, "host CPU utilisation"),
    Feature("mem_util", "fraction", 0.0, 1.0, "host memory utilisation"),
    Feature("iteration_time", "log10(s)", -3.0, 2.0, "wall time per iteration"),
    Feature("compute_time", "log10(s)", -3.0, 2.0, "input pipeline + forward + backward per iteration"),
    Feature("idle_fraction", "fraction", 0.0, 1.0, "share of the iteration spent waiting at the barrier"),
    Feature("local_batch", "log2(samples)", 2.0, 14.0, "current local batch"),
    Feature("batch_accuracy", "fraction", 0.0, 1.0, "training-batch accuracy over the interval"),
    Feature(
        "accuracy_gain", "fraction", -0.25, 0.25, "batch accuracy minus its value `window` intervals ago"
    ),
    Feature("grad_norm_mean", "log10(norm)", -4.0, 3.0, "mean local gradient norm"),
    Feature("grad_norm_var", "log10(norm^2)", -10.0, 4.0, "variance of the local gradient norm"),
    Feature("compute_share", "fraction", 0.0, 1.0, "compute time / slowest live worker's compute time"),
    Feature("batch_ratio", "log2(ratio)", -6.0, 6.0, "local batch / mean live local batch"),
    Feature("speed_ratio", "log2(ratio)", -6.0, 6.0, "samples/s of compute / mean over live workers"),
    Feature("headroom_up", "log2(ratio)", 0.0, 10.0, "log2(memory-cap batch / local batch)"),
    Feature("headroom_down", "log2(ratio)", 0.0, 10.0, "log2(local batch / minimum batch)"),
    Feature("gpu_util", "fraction", 0.0, 1.0, "device busy fraction"),
    Feature("alive", "flag", 0.0, 1.0, "1 if the worker took part in the interval"),
)

GLOBAL_FEATURES: tuple[Feature, ...] = (
    Feature(
        "val_accuracy",
        "fraction",
        0.0,
        1.0,
        "validation quality (accuracy, or the metric as a rising fraction)",
    ),
    Feature("val_loss", "ln(C) units", 0.0, 2.0, "validation loss / ln(number of classes)"),
    Feature("accuracy_to_target", "fraction", -0.5, 1.0, "target accuracy minus validation accuracy"),
    Feature(
        "val_accuracy_gain",
        "fraction",
        -0.25,
        0.25,
        "validation accuracy minus its value `window` intervals ago",
    ),
    Feature("global_batch", "log2(samples)", 4.0, 18.0, "sum of live local batches"),
    Feature("noise_scale", "log10(samples)", 0.0, 7.0, "gradient noise scale estimate (two-batch, EMA)"),
    Feature("noise_to_batch", "log2(ratio)", -12.0, 12.0, "noise scale estimate / global batch"),
    Feature("efficiency", "fraction", 0.0, 1.0, "statistical efficiency E(M) from the estimate"),
    Feature("time_used", "fraction", 0.0, 1.5, "wall time / episode time budget"),
    Feature("comm_fraction", "fraction", 0.0, 1.0, "exposed all-reduce / iteration time"),
    Feature("mean_idle_fraction", "fraction", 0.0, 1.0, "idle fraction averaged over live workers"),
    Feature("num_workers", "log2(workers)", 0.0, 10.0, "live workers"),
    Feature("interval_time", "log10(s)", -2.0, 4.0, "wall time of the last interval"),
)


OBS_SCHEMA_V1 = ObservationSchema(SCHEMA_VERSION_V1, WORKER_FEATURES, GLOBAL_FEATURES)
__doc__ = with_table(__doc__, OBS_SCHEMA_V1)

_W_LOW = np.array([f.low for f in WORKER_FEATURES])
_W_HIGH = np.array([f.high for f in WORKER_FEATURES])
_G_LOW = np.array([f.low for f in GLOBAL_FEATURES])
_G_HIGH = np.array([f.high for f in GLOBAL_FEATURES])


_FW, _FG = len(WORKER_FEATURES), len(GLOBAL_FEATURES)
_W = {f.name: i for i, f in enumerate(WORKER_FEATURES)}
_SPEED_RATIO_DEAD = WORKER_FEATURES[_W["speed_ratio"]].low


class ObservationEncoder(EncoderBase):
    """Turns interval reports into normalised observations; keeps the short history it needs.

    A dead worker (``alive`` false) reads idle fraction 0, compute share 0 and the lowest speed
    ratio; the cluster means (batch, speed, iteration time, idle) are over live workers only.

    Args:
        spec: the backend's spec (limits, target, budget).
        window: intervals over which accuracy gains are measured.
        noise_smoothing: EMA weight of the noise-scale estimator.
    """

    schema = OBS_SCHEMA_V1

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        super().__init__(spec, window, noise_smoothing)
        n = spec.num_workers
        self._log2_max = np.log2(spec.max_batch.astype(np.float64))
        self._log2_min = np.log2(spec.min_batch.astype(np.float64))
        self._log_classes = math.log(spec.num_classes)
        # Rows of the report fields the encoder reads, in one (field, worker) array per interval:
        # the first six enter as log10(field * mul + add) floored at ``floor`` (net bytes in MB/s,
        # retransmissions per second (mul set per interval), iteration and compute time, gradient
        # norm mean and variance).
        self._log_mul = np.array([[1e-6], [1.0], [1.0], [1.0], [1.0], [1.0]])
        self._log_add = np.array([[1.0], [1.0], [0.0], [0.0], [0.0], [1e-12]])
        self._log_floor = np.array([[0.0], [0.0], [1e-9], [1e-9], [1e-12], [0.0]])
        self._logs = np.empty((6, n))
        # The centralised observation before normalisation, in its final order; ``_raw`` is its
        # (worker, feature) view. Normalisation runs once over the whole flat vector.
        self._flat = np.empty(n * _FW + _FG)
        self._raw = self._flat[: n * _FW].reshape(n, _FW)
        tile = np.concatenate
        self._low = tile([np.tile(_W_LOW, n), _G_LOW])
        self._high = tile([np.tile(_W_HIGH, n), _G_HIGH])
        scale = 2.0 / (self._high - self._low)
        self._scale, self._offset = scale, -1.0 - self._low * scale
        self.reset()

    def reset(self) -> None:
        self.noise.reset()
        self._batch_acc: deque[np.ndarray] = deque(maxlen=self.window + 1)
        self._val_acc: deque[float] = deque(maxlen=self.window + 1)

    def encode(self, report: IntervalReport) -> np.ndarray:
        """Consume one report; return the centralised observation (float32, a new array)."""
        # This runs once per env step and its cost is benchmarked (experiments.bench_env): a numpy
        # call costs ~0.5-1 us whatever the size of these tiny arrays, so features are computed
        # with few, wide calls, and sums over the workers go through Python lists.
        spec = self.spec
        bn = self.noise.update(report)
        self._batch_acc.append(report.batch_accuracy)
        self._val_acc.append(float(report.val_accuracy))
        live = report.alive
        live_list = live.tolist()
        all_live = False not in live_list
        interval = max(report.interval_time_s, 1e-9)
        n = len(live_list)
        raw = self._raw
        if raw.shape[0] != n:
            raise ValueError(f"the report has {n} workers, the encoder's spec {raw.shape[0]}")

        # (field, worker) rows; the six log inputs are transformed in place.
        x = np.array(
            [
                report.net_bytes_per_s,
                report.tcp_retransmissions,
                report.iteration_time_s,
                report.compute_time_s,
                report.grad_norm_mean,
                report.grad_norm_var,
                report.local_batch,
                report.idle_time_s,
                report.cpu_util,
                report.mem_util,
                report.gpu_util,
                live,
            ],
            dtype=np.float64,
        )
        inputs = x[:6]
        self._log_mul[1, 0] = 1.0 / interval
        inputs *= self._log_mul
        inputs += self._log_add
        np.maximum(inputs, self._log_floor, out=inputs)
        logs = np.log10(inputs, out=self._logs)
        it, comp, b = x[2], x[3], x[6]  # iteration and compute time floored at 1 ns
        raw[:, 0:2] = logs[0:2].T
        raw[:, 2:4] = x[8:10].T  # cpu, memory
        raw[:, 4:6] = logs[2:4].T
        idle_frac = np.divide(x[7], it, out=raw[:, 6])
        log_b = np.log2(b, out=raw[:, 7])
        raw[:, 8] = report.batch_accuracy
        np.subtract(report.batch_accuracy, self._batch_acc[0], out=raw[:, 9])
        raw[:, 10:12] = logs[4:6].T
        rate = b / comp
        raw[:, 17:19] = x[10:12].T  # device busy, alive

        if all_live:
            mean_b, mean_rate = sum(b.tolist()) / n, sum(rate.tolist()) / n
            slowest, iter_mean = max(comp.tolist()), sum(it.tolist()) / n
            mean_idle, n_live = sum(idle_frac.tolist()) / n, n
        else:
            n_live = n - live_list.count(False)
            if n_live:
                mean_b, mean_rate = float(b[live].mean()), float(rate[live].mean())
                slowest, iter_mean = float(comp[live].max()), float(it[live].mean())
                mean_idle = float(idle_frac[live].mean())
            else:
                mean_b = mean_rate = slowest = iter_mean = 1.0
                mean_idle = 0.0
        np.divide(comp, slowest, out=raw[:, 12])
        np.subtract(log_b, math.log2(max(mean_b, 1e-12)), out=raw[:, 13])
        speed = np.log2(rate, out=rate)
        np.subtract(speed, math.log2(max(mean_rate, 1e-12)), out=raw[:, 14])
        np.subtract(self._log2_max, log_b, out=raw[:, 15])
        np.subtract(log_b, self._log2_min, out=raw[:, 16])
        if not all_live:
            dead = ~live
            raw[dead, _W["idle_fraction"]] = 0.0
            raw[dead, _W["compute_share"]] = 0.0
            raw[dead, _W["speed_ratio"]] = _SPEED_RATIO_DEAD

        m = max(report.global_batch, 1)
        bn_value = bn if bn is not None else float(spec.base_batch)
        self._flat[n * _FW :] = (
            report.val_accuracy,
            report.val_loss / self._log_classes,
            spec.target_accuracy - report.val_accuracy,
            report.val_accuracy - self._val_acc[0],
            math.log2(m),
            math.log10(max(bn_value, 1.0)),
            math.log2(max(bn_value, 1e-9) / m),
            statistical_efficiency(bn_value, m, spec.base_batch),
            report.wall_time_s / spec.time_budget_s,
            min(report.comm_time_s / iter_mean, 1.0),
            mean_idle,
            math.log2(max(n_live, 1)),
            math.log10(interval),
        )
        # Clip each feature to its raw range and map it affinely onto [-1, 1].
        flat = self._flat
        np.maximum(flat, self._low, out=flat)
        np.minimum(flat, self._high, out=flat)
        flat *= self._scale
        flat += self._offset
        return flat.astype(np.float32)
