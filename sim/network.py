"""Communication model: the all-reduce time an iteration cannot hide behind compute.

Pollux's form (Qiao et al., OSDI'21), fitted per (GPU type / network, application) by
``python -m experiments.fit_hardware`` from the measured ``sync_time_s`` and stored in
``sim/data/comm_models.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.datafiles import data_path, load_param_table, lookup_pair
from sim.hardware import smooth_max
from sim.validation import check_range

COMM_MODELS_FILE = "comm_models.json"

#: TCP maximum segment size on a 1500-byte MTU path: the unit retransmissions are counted in.
TCP_MSS_BYTES = 1448


@dataclass(frozen=True)
class CommParams:
    """Fitted all-reduce model of one (GPU type, application).

    T_sync(R, nodes) = 0                                   for R = 1 replica
                     = alpha_intra_s + beta_intra_s * (R - 2)   all replicas on one node
                     = alpha_inter_s + beta_inter_s * (R - 2)   replicas on several nodes
    T_iter           = (T_compute ** gamma + T_sync ** gamma) ** (1 / gamma)   # gamma >= 1: overlap
    exposed comm     = T_iter - T_compute
    """

    gpu: str
    app: str
    alpha_intra_s: float
    beta_intra_s: float
    alpha_inter_s: float
    beta_inter_s: float
    gamma: float
    fit_mape: float = float("nan")  # in-sample mean abs. percentage error of the step time

    def __post_init__(self) -> None:
        for name in ("alpha_intra_s", "beta_intra_s", "alpha_inter_s", "beta_inter_s"):
            check_range(f"{self.gpu}/{self.app}.{name}", getattr(self, name), 0.0)
        check_range(f"{self.gpu}/{self.app}.gamma", self.gamma, 1.0, 64.0)

    def sync_time_s(self, replicas: int, nodes: int) -> float:
        """T_sync for ``replicas`` workers spread over ``nodes`` nodes (no jitter)."""
        if replicas <= 1:
            return 0.0
        if nodes <= 1:
            return self.alpha_intra_s + self.beta_intra_s * (replicas - 2)
        return self.alpha_inter_s + self.beta_inter_s * (replicas - 2)


def comm_table(path: str | Path | None = None) -> dict[tuple[str, str], CommParams]:
    """All fitted communication models, keyed by (gpu, app)."""
    return load_param_table(CommParams, path or data_path(COMM_MODELS_FILE), ("gpu", "app"))


def comm_params(gpu: str, app: str, path: str | Path | None = None) -> CommParams:
    return lookup_pair(comm_table(path), gpu, app, COMM_MODELS_FILE)


class CommModel:
    """All-reduce of a (possibly mixed) cluster.

    A ring all-reduce is paced by its slowest link, so a mixed cluster takes the largest T_sync of
    the GPU types (networks) it spans, and that type's overlap exponent gamma. ``size_scale`` rescales the fitted times for a model whose
    gradient is larger or smaller than the measured one (bytes ratio).
    """

    def __init__(
        self,
        params: list[CommParams],
        replicas: int,
        nodes: int,
        model_bytes: float,
        size_scale: float = 1.0,
    ) -> None:
        self.params = params
        self.replicas = replicas
        self.nodes = nodes
        self.model_bytes = float(model_bytes)
        # The bottleneck type (largest T_sync) paces the ring; its overlap exponent applies.
        bottleneck = max(params, key=lambda p: p.sync_time_s(replicas, nodes))
        self.base_sync_s = size_scale * bottleneck.sync_time_s(replicas, nodes)
        self.gamma = bottleneck.gamma
        # Ring all-reduce: each worker sends (and receives) 2 (R - 1) / R of the gradient.
        self.bytes_per_iteration = 2.0 * (replicas - 1) / replicas * self.model_bytes if replicas > 1 else 0.0

    def sync_time_s(self, bandwidth_factor: float = 1.0, extra_latency_s: float = 0.0) -> float:
        """T_sync under jitter: bandwidth scaled by ``bandwidth_factor`` (<= 1 is slower), plus
        ``extra_latency_s`` per ring step (2 (R - 1) steps)."""
        if self.replicas <= 1:
            return 0.0
        return self.base_sync_s / bandwidth_factor + 2 * (self.replicas - 1) * extra_latency_s

    def iteration_time_s(self, compute_time_s: np.ndarray, sync_time_s: float | np.ndarray) -> np.ndarray:
        """(T_compute^gamma + T_sync^gamma)^(1/gamma), elementwise."""
        return smooth_max(compute_time_s, sync_time_s, self.gamma)
