"""The observation schema, defined once: named features with units, raw ranges and normalisation.

Each feature is computed from the backend-neutral :class:`~sim.report.IntervalReport` (plus a short
history kept by :class:`ObservationEncoder`), clipped to its raw range ``[low, high]`` and mapped
affinely onto [-1, 1]. Per-worker features describe one worker (DYNAMIX's state plus relative
quantities that let one policy serve any cluster size); global features describe the job.

Centralised observation: ``[worker 0 features, ..., worker N-1 features, global features]``.
Per-worker observation:  ``[this worker's features, global features]``.

Bump :data:`SCHEMA_VERSION` whenever a feature, its order, its range or its meaning changes:
bundles record the version they were trained with and refuse to drive a different one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from dynamix_gym.backend import BackendSpec
from dynamix_gym.stats import NoiseScaleEstimator, statistical_efficiency
from sim.report import IntervalReport

SCHEMA_VERSION = "1"


@dataclass(frozen=True)
class Feature:
    name: str
    unit: str  # unit of the raw value, before normalisation
    low: float  # raw range; values outside are clipped to it
    high: float
    description: str


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
    Feature("val_accuracy", "fraction", 0.0, 1.0, "validation accuracy"),
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


@dataclass(frozen=True)
class ObservationSchema:
    version: str
    worker_features: tuple[Feature, ...]
    global_features: tuple[Feature, ...]

    @property
    def worker_dim(self) -> int:
        return len(self.worker_features)

    @property
    def global_dim(self) -> int:
        return len(self.global_features)

    def centralised_dim(self, num_workers: int) -> int:
        return num_workers * self.worker_dim + self.global_dim

    @property
    def per_worker_dim(self) -> int:
        return self.worker_dim + self.global_dim

    def centralised_names(self, num_workers: int) -> list[str]:
        names = [f"w{i}.{f.name}" for i in range(num_workers) for f in self.worker_features]
        return names + [f"global.{f.name}" for f in self.global_features]

    def per_worker_names(self) -> list[str]:
        return [f"self.{f.name}" for f in self.worker_features] + [
            f"global.{f.name}" for f in self.global_features
        ]

    def as_table(self) -> str:
        """Markdown table of the per-worker observation (index, name, unit, raw range)."""
        lines = ["| index | name | unit | raw range | description |", "|---|---|---|---|---|"]
        for i, (name, f) in enumerate(
            zip(self.per_worker_names(), self.worker_features + self.global_features, strict=True)
        ):
            lines.append(f"| {i} | {name} | {f.unit} | [{f.low:g}, {f.high:g}] | {f.description} |")
        return "\n".join(lines)


OBS_SCHEMA = ObservationSchema(SCHEMA_VERSION, WORKER_FEATURES, GLOBAL_FEATURES)

_W_LOW = np.array([f.low for f in WORKER_FEATURES])
_W_HIGH = np.array([f.high for f in WORKER_FEATURES])
_G_LOW = np.array([f.low for f in GLOBAL_FEATURES])
_G_HIGH = np.array([f.high for f in GLOBAL_FEATURES])


_W_SCALE, _G_SCALE = 2.0 / (_W_HIGH - _W_LOW), 2.0 / (_G_HIGH - _G_LOW)
_W_OFFSET, _G_OFFSET = -1.0 - _W_LOW * _W_SCALE, -1.0 - _G_LOW * _G_SCALE


def _normalise(
    raw: np.ndarray, low: np.ndarray, high: np.ndarray, scale: np.ndarray, offset: np.ndarray
) -> np.ndarray:
    """Clip to [low, high] and map affinely onto [-1, 1] (in place on ``raw``)."""
    np.maximum(raw, low, out=raw)
    np.minimum(raw, high, out=raw)
    raw *= scale
    raw += offset
    return raw.astype(np.float32)


class ObservationEncoder:
    """Turns interval reports into normalised observations; keeps the short history it needs.

    Args:
        spec: the backend's spec (limits, target, budget).
        window: intervals over which accuracy gains are measured.
        noise_smoothing: EMA weight of the noise-scale estimator.
    """

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.spec = spec
        self.window = window
        self.noise = NoiseScaleEstimator(noise_smoothing)
        self._log2_max = np.log2(spec.max_batch.astype(np.float64))
        self._log2_min = np.log2(spec.min_batch.astype(np.float64))
        self._log_classes = math.log(spec.num_classes)
        self.reset()

    def reset(self) -> None:
        self.noise.reset()
        self._batch_acc: deque[np.ndarray] = deque(maxlen=self.window + 1)
        self._val_acc: deque[float] = deque(maxlen=self.window + 1)

    def update(self, report: IntervalReport) -> tuple[np.ndarray, np.ndarray]:
        """Consume one report; return (worker features (N, Fw), global features (Fg,)), normalised."""
        spec = self.spec
        self.noise.update(report)
        self._batch_acc.append(report.batch_accuracy)
        self._val_acc.append(float(report.val_accuracy))
        live = report.alive
        all_live = bool(live.all())
        n_live = live.size if all_live else int(live.sum())
        b = report.local_batch.astype(np.float64)
        it = np.maximum(report.iteration_time_s, 1e-9)
        comp = np.maximum(report.compute_time_s, 1e-9)
        interval = max(report.interval_time_s, 1e-9)
        # Few, wide numpy calls: this runs once per env step and its cost is benchmarked.
        logs = np.log10(
            np.array(
                [
                    1.0 + 1e-6 * report.net_bytes_per_s,
                    1.0 + report.tcp_retransmissions / interval,
                    it,
                    comp,
                    np.maximum(report.grad_norm_mean, 1e-12),
                    report.grad_norm_var + 1e-12,
                ]
            )
        )
        log_b = np.log2(b)
        rate = b / comp
        idle_frac = report.idle_time_s / it
        if all_live:  # ndarray.sum / max are much cheaper than .mean() on tiny arrays
            n = b.size
            mean_b, mean_rate = float(b.sum()) / n, float(rate.sum()) / n
            slowest, iter_mean, mean_idle = float(comp.max()), float(it.sum()) / n, float(idle_frac.sum()) / n
        elif n_live:
            idle_frac = np.where(live, idle_frac, 0.0)
            mean_b, mean_rate = float(b[live].mean()), float(rate[live].mean())
            slowest, iter_mean = float(comp[live].max()), float(it[live].mean())
            mean_idle = float(idle_frac[live].mean())
        else:
            mean_b = mean_rate = slowest = iter_mean = 1.0
            mean_idle = 0.0
        raw = np.array(
            [
                logs[0],
                logs[1],
                report.cpu_util,
                report.mem_util,
                logs[2],
                logs[3],
                idle_frac,
                log_b,
                report.batch_accuracy,
                report.batch_accuracy - self._batch_acc[0],
                logs[4],
                logs[5],
                comp / slowest,
                log_b - math.log2(max(mean_b, 1e-12)),
                np.log2(rate / max(mean_rate, 1e-12)),
                self._log2_max - log_b,
                log_b - self._log2_min,
                report.gpu_util,
                live,
            ]
        ).T
        if not all_live:
            dead = ~live
            raw[dead, 12] = 0.0
            raw[dead, 14] = _W_LOW[14]

        m = max(report.global_batch, 1)
        bn = self.noise.noise_scale
        bn_value = bn if bn is not None else float(spec.base_batch)
        glob = np.array(
            [
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
            ]
        )
        return (
            _normalise(raw, _W_LOW, _W_HIGH, _W_SCALE, _W_OFFSET),
            _normalise(glob, _G_LOW, _G_HIGH, _G_SCALE, _G_OFFSET),
        )

    @staticmethod
    def centralise(worker: np.ndarray, glob: np.ndarray) -> np.ndarray:
        return np.concatenate([worker.reshape(-1), glob]).astype(np.float32)

    @staticmethod
    def per_worker(worker: np.ndarray, glob: np.ndarray) -> np.ndarray:
        """(N, Fw + Fg): each worker's own features followed by the shared global features."""
        n = worker.shape[0]
        return np.concatenate([worker, np.broadcast_to(glob, (n, glob.shape[0]))], axis=1).astype(np.float32)


def split_centralised(obs: np.ndarray, num_workers: int) -> np.ndarray:
    """(N, Fw + Fg) per-worker rows from a centralised observation of ``num_workers`` workers."""
    obs = np.asarray(obs)
    fw = OBS_SCHEMA.worker_dim
    if obs.shape != (OBS_SCHEMA.centralised_dim(num_workers),):
        raise ValueError(
            f"a centralised observation of {num_workers} workers has shape "
            f"({OBS_SCHEMA.centralised_dim(num_workers)},), got {obs.shape}"
        )
    worker = obs[: num_workers * fw].reshape(num_workers, fw)
    return ObservationEncoder.per_worker(worker, obs[num_workers * fw :])
