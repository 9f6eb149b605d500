"""What every observation schema is made of: named features, the schema that orders them, and the
state every encoder holds.

A :class:`Feature` has a unit, a raw range ``[low, high]`` and a description; an encoder computes
its raw value from the backend-neutral :class:`~sim.protocol.IntervalReport` (plus a short history),
clips it to the range and maps it affinely onto [-1, 1]. An :class:`ObservationSchema` orders the
per-worker features (one block per worker) and the global features (the job's):

Centralised observation: ``[worker 0 features, ..., worker N-1 features, global features]``.
Per-worker observation:  ``[this worker's features, global features]``.

The tables people read (the docs' observation reference, written at every ``make docs``, the env's
docstring, each schema module's docstring) are :meth:`ObservationSchema.as_table`'s output, checked
by ``tests/dynamix_gym/obs/test_obs_tables.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamix_gym.stats import NoiseScaleEstimator
from sim.protocol import BackendSpec


@dataclass(frozen=True)
class Feature:
    name: str
    unit: str  # unit of the raw value, before normalisation
    low: float  # raw range; values outside are clipped to it
    high: float
    description: str


def per_worker_rows(worker: np.ndarray, glob: np.ndarray) -> np.ndarray:
    """(N, Fw + Fg): each worker's own features followed by the shared global features."""
    n = worker.shape[0]
    return np.concatenate([worker, np.broadcast_to(glob, (n, glob.shape[0]))], axis=1, dtype=np.float32)


@dataclass(frozen=True)
class ObservationSchema:
    """A version's features in order (bump the version whenever a feature, its order, its range or
    its meaning changes: bundles record the version they were trained with and refuse another)."""

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

    def split_centralised(self, obs: np.ndarray, num_workers: int) -> np.ndarray:
        """(N, Fw + Fg) per-worker rows from a centralised observation of ``num_workers`` workers."""
        obs = np.asarray(obs)
        fw, dim = self.worker_dim, self.centralised_dim(num_workers)
        if obs.shape != (dim,):
            raise ValueError(
                f"a centralised observation (schema {self.version}) of {num_workers} workers has shape "
                f"({dim},), got {obs.shape}"
            )
        worker = obs[: num_workers * fw].reshape(num_workers, fw)
        return per_worker_rows(worker, obs[num_workers * fw :])

    def as_table(self, centralised: bool = False) -> str:
        """Markdown table of the observation (index, name, unit, raw range, description): the
        per-worker row of the shared policy (the docs' observation reference), or with ``centralised`` the env's
        flat observation, indexed ``Fw i + k`` (worker i) and ``Fw N + k`` (global; its docstring's)."""
        lines = ["| index | name | unit | raw range | description |", "|---|---|---|---|---|"]
        fw = self.worker_dim
        if centralised:
            index = [f"{fw} i + {k}" for k in range(fw)] + [f"{fw} N + {k}" for k in range(self.global_dim)]
            names = [f.name for f in self.worker_features + self.global_features]
        else:
            index, names = [str(i) for i in range(self.per_worker_dim)], self.per_worker_names()
        for i, name, f in zip(index, names, self.worker_features + self.global_features, strict=True):
            lines.append(f"| {i} | {name} | {f.unit} | [{f.low:g}, {f.high:g}] | {f.description} |")
        return "\n".join(lines)


TABLE_MARK = (
    "Its table, generated from the features at import (the docs' observation reference shows it too):"
)
"""The sentence after which :func:`with_table` puts a schema module's table in its docstring."""


def with_table(doc: str | None, schema: ObservationSchema) -> str | None:
    """``doc`` with ``schema``'s per-worker table (:meth:`ObservationSchema.as_table`) after its
    :data:`TABLE_MARK`: a schema module's docstring shows its table in ``help()`` without a copy kept
    by hand. ``None`` stays ``None`` (``python -OO`` strips docstrings)."""
    if doc is None:
        return None
    if TABLE_MARK not in doc:
        raise ValueError(f"the docstring has no table mark {TABLE_MARK!r}")
    return doc.replace(TABLE_MARK, f"{TABLE_MARK}\n\n{schema.as_table()}\n", 1)


class EncoderBase:
    """What every schema's encoder holds: the backend spec, the history window and the
    noise-scale estimator. Subclasses set ``schema`` (their :class:`ObservationSchema`), build their
    buffers on top and implement ``reset()`` and ``encode(report)`` (the centralised observation,
    float32, a new array)."""

    schema: ObservationSchema

    def __init__(self, spec: BackendSpec, window: int = 4, noise_smoothing: float = 0.2) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.spec = spec
        self.window = window
        self.noise = NoiseScaleEstimator(noise_smoothing)
