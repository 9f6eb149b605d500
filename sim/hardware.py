"""Per-GPU compute model: how long one local step takes at a given local batch.

The parameters are data, produced from measured step times by ``python -m experiments.fit_hardware``
(see ``sim/fitting/hardware.py``) and stored in ``sim/data/compute_models.json`` together with their fit error.
Nothing here is hand-tuned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.datafiles import data_path, load_param_table, lookup_pair
from sim.validation import check_positive, check_range

#: Device memory per GPU type, GiB (vendor spec sheets; used only for the memory-utilisation signal).
GPU_MEMORY_GIB: dict[str, float] = {
    "T4": 16.0,
    "V100": 32.0,
    "RTX2080Ti": 11.0,
    "QuadroRTX6000": 24.0,
    "A100": 40.0,
}

COMPUTE_MODELS_FILE = "compute_models.json"


@dataclass(frozen=True)
class ComputeParams:
    """Fitted compute model of one (GPU type, application).

    T_gpu(b)     = alpha_s + beta_s * b ** exponent            # launch overhead + per-sample GPU work
                   + knee_beta_s * max(0, b - knee_batch)      # extra per-sample cost past a knee
                                                               # (working set out of cache; no knee
                                                               # unless fitted)
    T_host       = host_s                                      # host / input-pipeline floor per step
    T_compute(b) = (T_host ** k + T_gpu(b) ** k) ** (1 / k)    # smooth max: flat host-bound region at
                                                               # small batches, GPU-bound beyond it
    """

    gpu: str
    app: str
    alpha_s: float
    beta_s: float
    exponent: float
    host_s: float
    k: float
    max_batch: int  # largest local batch measured for this pair: the memory cap
    min_batch: int = 1
    loo_mdape: float = float("nan")  # leave-one-batch-size-out median abs. percentage error
    fit_mape: float = float("nan")  # in-sample mean abs. percentage error
    knee_batch: float | None = None  # local batch past which knee_beta_s is added per sample
    knee_beta_s: float = 0.0

    def __post_init__(self) -> None:
        check_range(f"{self.gpu}/{self.app}.alpha_s", self.alpha_s, 0.0)
        check_positive(f"{self.gpu}/{self.app}.beta_s", self.beta_s)
        check_range(f"{self.gpu}/{self.app}.exponent", self.exponent, 0.25, 2.0)
        check_range(f"{self.gpu}/{self.app}.host_s", self.host_s, 0.0)
        check_range(f"{self.gpu}/{self.app}.k", self.k, 1.0, 64.0)
        check_range(f"{self.gpu}/{self.app}.max_batch", self.max_batch, 1)
        check_range(f"{self.gpu}/{self.app}.knee_beta_s", self.knee_beta_s, 0.0)
        if self.knee_batch is not None:
            check_range(f"{self.gpu}/{self.app}.knee_batch", self.knee_batch, 1.0)
        elif self.knee_beta_s != 0.0:
            raise ValueError(f"{self.gpu}/{self.app}.knee_beta_s is {self.knee_beta_s} without a knee_batch")

    def knee_time_s(self, b: np.ndarray | float) -> np.ndarray | float:
        """The extra per-step time past the knee (0 without one)."""
        if self.knee_batch is None:
            return 0.0
        return self.knee_beta_s * np.maximum(0.0, np.asarray(b, dtype=np.float64) - self.knee_batch)


class ComputeModel:
    """Vectorised evaluation of :class:`ComputeParams` with runtime slow-down multipliers."""

    def __init__(self, params: ComputeParams, flops_scale: float = 1.0) -> None:
        self.params = params
        # A workload derived from a measured one (e.g. ResNet-34 from ResNet-18) scales the GPU
        # part by its FLOP ratio; the host floor (input pipeline) stays that of the dataset.
        self.flops_scale = check_positive("flops_scale", flops_scale)

    def gpu_time_s(self, local_batch: np.ndarray | float) -> np.ndarray:
        p = self.params
        b = np.asarray(local_batch, dtype=np.float64)
        return (p.alpha_s + p.beta_s * b**p.exponent + p.knee_time_s(b)) * self.flops_scale

    def host_time_s(self) -> float:
        return self.params.host_s

    def compute_time_s(
        self,
        local_batch: np.ndarray | float,
        gpu_slowdown: np.ndarray | float = 1.0,
        host_slowdown: np.ndarray | float = 1.0,
    ) -> np.ndarray:
        """T_compute(b) with the GPU part and the host floor each stretched by a slow-down factor."""
        host = self.host_time_s() * np.asarray(host_slowdown)
        return smooth_max(host, self.gpu_time_s(local_batch) * gpu_slowdown, self.params.k)


def smooth_max(a: np.ndarray | float, b: np.ndarray | float, k: float) -> np.ndarray:
    """(a^k + b^k)^(1/k): the k-norm, a smooth maximum of two non-negative times."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = np.maximum(a, b)
    safe = np.where(m > 0, m, 1.0)
    return m * ((a / safe) ** k + (b / safe) ** k) ** (1.0 / k)


def compute_table(path: str | Path | None = None) -> dict[tuple[str, str], ComputeParams]:
    """All fitted compute models, keyed by (gpu, app). ``path`` defaults to the shipped fit."""
    return load_param_table(ComputeParams, path or data_path(COMPUTE_MODELS_FILE), ("gpu", "app"))


def compute_params(gpu: str, app: str, path: str | Path | None = None) -> ComputeParams:
    """The fitted model for ``gpu`` running ``app``; a clear error for an unknown pair."""
    return lookup_pair(compute_table(path), gpu, app, COMPUTE_MODELS_FILE)
