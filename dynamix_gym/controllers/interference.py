"""DynPipe's interference predictor, carried over to data parallelism: a random forest that
predicts each worker's slowdown ratio from the counters of an interval report.

Features (per worker, from :class:`~sim.protocol.IntervalReport` alone, so the same code runs on the
simulator and on real DDP; DynPipe's runtime counters have their data-parallel analogues here):

    | index | name | meaning |
    |---|---|---|
    | 0 | per_sample_vs_min | log2(compute s/sample / the worker's smallest so far) |
    | 1 | per_sample_vs_ema | log2(compute s/sample / its moving average) |
    | 2 | per_sample_vs_type | log2(compute s/sample / median of live workers of the same GPU type) |
    | 3 | compute_vs_cluster | log2(compute time / median live compute time) |
    | 4 | idle_fraction | idle / iteration time |
    | 5 | gpu_util | device busy fraction |
    | 6 | cpu_util | host CPU utilisation |
    | 7 | cpu_vs_ema | cpu_util minus its moving average |
    | 8 | mem_util | host memory utilisation |
    | 9 | net_mbps | log10(1 + MB/s sent) |
    | 10 | retrans | log10(1 + retransmissions/s) |
    | 11 | local_batch | log2(local batch) |
    | 12 | batch_vs_mean | log2(local batch / mean live batch) |

Target (simulator only): the worker's slowdown ratio, max(GPU slow-down, host slow-down) of its
fault state divided by the smallest value it had in the run (its uncontended state). The forest is
fitted by ``python -m experiments.fit_interference`` on the benchmark's train split and generated
interference scenarios (seeds >= 100), never on its test split.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from sim.protocol import BackendSpec, IntervalReport

FEATURES = (
    "per_sample_vs_min",
    "per_sample_vs_ema",
    "per_sample_vs_type",
    "compute_vs_cluster",
    "idle_fraction",
    "gpu_util",
    "cpu_util",
    "cpu_vs_ema",
    "mem_util",
    "net_mbps",
    "retrans",
    "local_batch",
    "batch_vs_mean",
)
FORMAT = 1


class InterferenceFeatures:
    """The per-worker feature rows of each report (keeps the moving averages it needs).

    Args:
        spec: the backend's spec (GPU types group the workers).
        smoothing: EMA weight of the newest interval.
    """

    def __init__(self, spec: BackendSpec, smoothing: float = 0.3) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must lie in (0, 1], got {smoothing}")
        self.spec = spec
        self.smoothing = float(smoothing)
        types = np.array(spec.gpu_types)
        self._groups = [np.flatnonzero(types == t) for t in dict.fromkeys(spec.gpu_types)]
        self.reset()

    def reset(self) -> None:
        n = self.spec.num_workers
        self._min = np.full(n, np.inf)
        self._ema = np.full(n, np.nan)
        self._cpu_ema = np.full(n, np.nan)

    def update(self, report: IntervalReport) -> np.ndarray:
        """(N, 13) feature rows; dead workers' rows are zeros."""
        n = self.spec.num_workers
        live = report.alive & (report.compute_time_s > 0)
        b = np.maximum(report.local_batch.astype(np.float64), 1.0)
        comp = np.maximum(report.compute_time_s, 1e-9)
        per = comp / b
        a = self.smoothing
        self._min = np.where(live, np.minimum(self._min, per), self._min)
        ema = np.where(np.isnan(self._ema), per, self._ema)
        cpu_ema = np.where(np.isnan(self._cpu_ema), report.cpu_util, self._cpu_ema)
        by_type = np.ones(n)
        for g in self._groups:
            g_live = g[live[g]]
            if g_live.size:
                by_type[g] = np.median(per[g_live])
        med_comp = float(np.median(comp[live])) if live.any() else 1.0
        mean_b = float(b[live].mean()) if live.any() else 1.0
        interval = max(report.interval_time_s, 1e-9)
        x = np.column_stack(
            [
                np.log2(per / np.where(np.isfinite(self._min), self._min, per)),
                np.log2(per / ema),
                np.log2(per / by_type),
                np.log2(comp / med_comp),
                np.clip(report.idle_time_s / np.maximum(report.iteration_time_s, 1e-9), 0.0, 1.0),
                report.gpu_util,
                report.cpu_util,
                report.cpu_util - cpu_ema,
                report.mem_util,
                np.log10(1.0 + report.net_bytes_per_s / 1e6),
                np.log10(1.0 + report.tcp_retransmissions / interval),
                np.log2(b),
                np.log2(b / mean_b),
            ]
        )
        self._ema = np.where(live, a * per + (1 - a) * ema, self._ema)
        self._cpu_ema = np.where(live, a * report.cpu_util + (1 - a) * cpu_ema, self._cpu_ema)
        x[~live] = 0.0
        return x


def true_slowdown(report: IntervalReport) -> np.ndarray:
    """max(GPU, host) slow-down factor of each worker's fault state (simulator reports only)."""
    if report.truth is None:
        raise ValueError("true_slowdown needs a simulated report (report.truth is None on real backends)")
    t = report.truth
    return np.maximum(np.asarray(t["gpu_slowdown"], dtype=np.float64), np.asarray(t["host_slowdown"]))


@dataclass
class ForestPredictor:
    """A fitted forest and what it was fitted on, saved as ``forest.pkl`` + ``forest.json`` (its
    ``FEATURES`` and ``FORMAT`` checked on load). Subclasses name their features and their fitter."""

    model: Any  # sklearn.ensemble.RandomForestRegressor
    meta: dict[str, Any]

    FEATURES: ClassVar[tuple[str, ...]] = FEATURES
    FORMAT: ClassVar[int] = FORMAT
    WHAT: ClassVar[str] = "interference predictor"
    FITTER: ClassVar[str] = "python -m experiments.fit_interference"

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Predicted slowdown ratio (>= 1) per feature row."""
        return np.maximum(self.model.predict(features), 1.0)

    def save(self, folder: str | Path) -> Path:
        from sim.datafiles import atomic_write, atomic_write_text

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        blob = pickle.dumps(self.model, protocol=5)
        atomic_write(folder / "forest.pkl", lambda f: f.write(blob), mode="wb")
        atomic_write_text(
            folder / "forest.json", json.dumps({**self.meta, "format": self.FORMAT}, indent=1) + "\n"
        )
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> Self:
        """Load a predictor written by :meth:`save` (a file this project wrote: pickle is trusted)."""
        folder = Path(folder)
        meta_file = folder / "forest.json"
        if not meta_file.is_file():
            raise FileNotFoundError(
                f"{folder} holds no {cls.WHAT} ({meta_file.name} missing); fit one with {cls.FITTER}"
            )
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != cls.FORMAT or meta.get("features") != list(cls.FEATURES):
            raise ValueError(f"{folder}: predictor format/features differ from this version's; refit it")
        with open(folder / "forest.pkl", "rb") as f:
            model = pickle.load(f)
        return cls(model, meta)


class SlowdownPredictor(ForestPredictor):
    """The data-parallel workers' predictor (this module's ``FEATURES``)."""
