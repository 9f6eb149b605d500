"""Calibrated cluster profiles: the simulator fitted to one real setup.

A profile is a directory written by ``python -m experiments.calibrate``::

    profile.json             format, name, cluster, workload, simulator settings (measured
                             overheads), device memory of new worker types, provenance, fit report
    compute_models.json      sim.hardware.ComputeParams rows   ({"models": [...]}, as in sim/data)
    comm_models.json         sim.network.CommParams rows
    convergence_models.json  sim.convergence.ConvergenceParams rows (may be absent or empty)
    measurements.csv         the measured step times in the reference format (what the fit saw)

``Simulator(profile=...)``, ``SimBackend(profile=...)`` and ``HeteroClusterEnv(profile=...)`` take
the directory, its ``profile.json``, a name under ``sim/data/profiles/`` or a loaded
:class:`ClusterProfile`. A lookup of a (worker type, application) model or a convergence model
tries the profile first and then the shipped fits, so a profile may add new worker types (e.g.
``cpu``: a CPU rank of this machine) beside the measured GPUs. The profile's cluster, workload and
``simulator`` settings (``reconfig_delay_s``, ``interval_overhead_s``, ``min_batch``) are the
simulator's defaults; explicit arguments win.

This module owns the format only: the fits that fill a profile are in :mod:`sim.fitting` (this
module imports nothing from there), the cluster's dict form is :func:`sim.specs_io.cluster_to_dict`
and the JSON writer :func:`sim.datafiles.dump_json`. Nothing here imports pandas (the simulator
imports this module).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sim.cluster import ClusterSpec, ProfiledNodeSpec
from sim.convergence import ConvergenceParams, convergence_params
from sim.datafiles import atomic_write_text, data_path, dump_json
from sim.hardware import GPU_MEMORY_GIB, ComputeModel, ComputeParams, compute_params
from sim.network import CommParams, comm_params
from sim.protocol import COMPUTE_CURVE_POINTS, compute_curve_batches
from sim.specs_io import cluster_from_dict, cluster_to_dict, spec_from_dict
from sim.validation import check_choice, check_positive
from sim.workloads import Workload

T = TypeVar("T")

PROFILE_FORMAT = 1
PROFILE_FILE = "profile.json"
COMPUTE_FILE = "compute_models.json"
COMM_FILE = "comm_models.json"
CONVERGENCE_FILE = "convergence_models.json"
MEASUREMENTS_FILE = "measurements.csv"
#: Where a profile given by name (not a path) is looked up.
PROFILES_DIR = "profiles"
#: ``simulator`` settings a profile may carry (Simulator keyword arguments).
SIMULATOR_KEYS = ("reconfig_delay_s", "interval_overhead_s", "min_batch", "compute_on_host")


# --------------------------------------------------------------------------------------------
# Model tables: shipped, and a profile's on top of them
# --------------------------------------------------------------------------------------------


class ModelTables:
    """The shipped fits (``sim/data``): what the simulator uses without a profile."""

    def compute_params(self, gpu: str, app: str) -> ComputeParams:
        return compute_params(gpu, app)

    def comm_params(self, gpu: str, app: str) -> CommParams:
        return comm_params(gpu, app)

    def convergence_params(self, name: str) -> ConvergenceParams:
        return convergence_params(name)

    def gpu_memory_gib(self, gpu: str) -> float:
        check_choice("gpu type (device memory)", gpu, GPU_MEMORY_GIB)
        return GPU_MEMORY_GIB[gpu]


SHIPPED_MODELS = ModelTables()


@dataclass(frozen=True, eq=False)
class ClusterProfile(ModelTables):
    """A loaded profile: fitted models keyed like the shipped tables, plus the setup they describe.

    Lookups fall back to the shipped fits for pairs the profile does not hold.
    """

    name: str
    cluster: ClusterSpec
    workload: Workload
    compute: Mapping[tuple[str, str], ComputeParams]
    comm: Mapping[tuple[str, str], CommParams]
    convergence: Mapping[str, ConvergenceParams] = field(default_factory=dict)
    memory_gib: Mapping[str, float] = field(default_factory=dict)
    simulator: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        unknown = [k for k in self.simulator if k not in SIMULATOR_KEYS]
        if unknown:
            raise ValueError(
                f"profile {self.name!r}: unknown simulator setting(s) {unknown}; known: {SIMULATOR_KEYS}"
            )
        wl = self.workload
        for gpu in sorted(set(self.cluster.gpu_types)):
            self.compute_params(gpu, wl.app)
            self.comm_params(gpu, wl.app)
            self.gpu_memory_gib(gpu)
        self.convergence_params(wl.convergence)

    @property
    def compute_on_host(self) -> bool:
        """Whether the profiled workers computed on the host CPU (no accelerator): then their
        compute is CPU time. The ``compute_on_host`` simulator setting, else the measured device."""
        if "compute_on_host" in self.simulator:
            return bool(self.simulator["compute_on_host"])
        real = (self.meta.get("provenance") or {}).get("real_config") or {}
        return str(real.get("device", "")) == "cpu"

    def _where(self) -> str:
        return f"profile {self.name!r}" + (f" ({self.path})" if self.path else "")

    def _lookup(self, table: Mapping, key: Any, shipped: Callable[..., T], what: str) -> T:
        """``table[key]``, else the shipped fit, else an error naming what neither holds."""
        if key in table:
            return table[key]
        try:
            return shipped(*key) if isinstance(key, tuple) else shipped(key)
        except ValueError:
            raise ValueError(
                f"no {what} in {self._where()} (it has {sorted(table)}) nor in the shipped fits"
            ) from None

    def compute_params(self, gpu: str, app: str) -> ComputeParams:
        return self._lookup(self.compute, (gpu, app), compute_params, f"compute model for ({gpu}, {app})")

    def comm_params(self, gpu: str, app: str) -> CommParams:
        return self._lookup(self.comm, (gpu, app), comm_params, f"communication model for ({gpu}, {app})")

    def convergence_params(self, name: str) -> ConvergenceParams:
        return self._lookup(self.convergence, name, convergence_params, f"convergence model {name!r}")

    def gpu_memory_gib(self, gpu: str) -> float:
        if gpu in self.memory_gib:
            return float(self.memory_gib[gpu])
        if gpu in GPU_MEMORY_GIB:
            return GPU_MEMORY_GIB[gpu]
        raise ValueError(f"{self._where()}: gpu_memory_gib has no entry for worker type {gpu!r}")


# --------------------------------------------------------------------------------------------
# Reading and writing
# --------------------------------------------------------------------------------------------


def profile_compute_curve(
    profile: ClusterProfile,
    gpu_types: tuple[str, ...],
    min_batch: np.ndarray,
    max_batch: np.ndarray,
    points: int = COMPUTE_CURVE_POINTS,
) -> np.ndarray:
    """(N, points) compute seconds per iteration of workers of ``gpu_types`` on ``profile``'s workload
    at :func:`~sim.protocol.compute_curve_batches` (a :attr:`~sim.protocol.BackendSpec.compute_curve_s`
    for real ranks, from their calibrated compute model; KeyError-like ValueError from the profile when it
    has no model of a type)."""
    grid = compute_curve_batches(np.asarray(min_batch), np.asarray(max_batch), points)
    app = profile.workload.app
    rows = [
        ComputeModel(profile.compute_params(g, app)).compute_time_s(grid[i]) for i, g in enumerate(gpu_types)
    ]
    return np.asarray(rows, dtype=np.float64)


def profile_path(ref: str | Path) -> Path:
    """The ``profile.json`` of a profile given as a directory, a file, or a name in ``sim/data/profiles``."""
    p = Path(ref)
    if p.is_dir():
        p = p / PROFILE_FILE
    if p.is_file():
        return p
    named = data_path(PROFILES_DIR) / str(ref) / PROFILE_FILE
    if isinstance(ref, str) and "/" not in ref and named.is_file():
        return named
    raise FileNotFoundError(
        f"cluster profile {str(ref)!r} not found: give a profile directory, its {PROFILE_FILE}, or the "
        f"name of a directory in {data_path(PROFILES_DIR)} (write one with python -m experiments.calibrate)"
    )


def _rows(cls: type[T], doc: Any, where: str) -> list[T]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("models"), list):
        raise ValueError(f"{where} must be a JSON object with a list under 'models'")
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    out = []
    for i, row in enumerate(doc["models"]):
        kwargs = {k: v for k, v in row.items() if k in names and v is not None}
        try:
            out.append(cls(**kwargs))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}, models[{i}]: {err}") from None
    return out


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load_profile(ref: str | Path | ClusterProfile) -> ClusterProfile:
    """Load and check a profile (see the module docstring for what ``ref`` may be).

    Raises:
        FileNotFoundError: no such profile.
        ValueError: a wrong format version, a missing section, or a cluster whose worker types have
            no compute / communication model for the workload (the message names the profile).
    """
    if isinstance(ref, ClusterProfile):
        return ref
    path = profile_path(ref)
    root = path.parent
    doc = _read_json(path)
    where = str(path)
    if doc.get("profile_format") != PROFILE_FORMAT:
        raise ValueError(
            f"{where}: profile_format {doc.get('profile_format')!r}, this version reads {PROFILE_FORMAT}"
        )
    for key in ("name", "cluster", "workload"):
        if key not in doc:
            raise ValueError(f"{where} lacks the required key {key!r}")
    memory = {
        str(k): check_positive(f"{where}: gpu_memory_gib[{k}]", v)
        for k, v in doc.get("gpu_memory_gib", {}).items()
    }
    cluster = cluster_from_dict(doc["cluster"], memory, where)
    workload = spec_from_dict(Workload, doc["workload"], f"{where}: workload")
    compute = {
        (p.gpu, p.app): p
        for p in _rows(ComputeParams, _read_json(root / COMPUTE_FILE), str(root / COMPUTE_FILE))
    }
    comm = {(p.gpu, p.app): p for p in _rows(CommParams, _read_json(root / COMM_FILE), str(root / COMM_FILE))}
    conv_file = root / CONVERGENCE_FILE
    conv = {}
    if conv_file.is_file():
        conv = {p.name: p for p in _rows(ConvergenceParams, _read_json(conv_file), str(conv_file))}
    return ClusterProfile(
        name=str(doc["name"]),
        cluster=cluster,
        workload=workload,
        compute=compute,
        comm=comm,
        convergence=conv,
        memory_gib=memory,
        simulator=dict(doc.get("simulator", {})),
        meta={
            k: v for k, v in doc.items() if k not in ("cluster", "workload", "simulator", "gpu_memory_gib")
        },
        path=root,
    )


def write_profile(
    out_dir: str | Path,
    *,
    name: str,
    cluster: ClusterSpec,
    workload: Workload,
    computes: Sequence[ComputeParams],
    comms: Sequence[CommParams],
    convergences: Sequence[ConvergenceParams] = (),
    gpu_memory_gib: Mapping[str, float] | None = None,
    simulator: Mapping[str, float] | None = None,
    meta: Mapping[str, Any] | None = None,
    model_extras: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
) -> ClusterProfile:
    """Write a profile directory (each file atomically) and return it loaded back (checked).

    ``model_extras``: per (gpu, app) diagnostics stored next to the compute model's fields (people
    read them; the loader ignores them).
    """
    out = Path(out_dir)
    memory = dict(gpu_memory_gib or {})
    for n in cluster.nodes:
        if isinstance(n, ProfiledNodeSpec):
            memory.setdefault(n.gpu, n.mem_gib)
    extras = model_extras or {}
    compute_rows = [{**asdict(p), **extras.get((p.gpu, p.app), {})} for p in computes]
    atomic_write_text(
        out / COMPUTE_FILE,
        dump_json({"generated_by": "python -m experiments.calibrate", "models": compute_rows}),
    )
    atomic_write_text(
        out / COMM_FILE,
        dump_json({"generated_by": "python -m experiments.calibrate", "models": [asdict(p) for p in comms]}),
    )
    atomic_write_text(
        out / CONVERGENCE_FILE,
        dump_json(
            {"generated_by": "python -m experiments.calibrate", "models": [asdict(p) for p in convergences]}
        ),
    )
    doc = {
        "profile_format": PROFILE_FORMAT,
        "name": name,
        "cluster": cluster_to_dict(cluster),
        "workload": asdict(workload),
        "gpu_memory_gib": memory,
        "simulator": dict(simulator or {}),
        **dict(meta or {}),
    }
    atomic_write_text(out / PROFILE_FILE, dump_json(doc))
    return load_profile(out)
