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

Besides the format, this module holds the fitting glue the calibration app uses on top of
:mod:`sim.fitting` and :mod:`sim.fit_convergence` (same model classes, same least-squares fits):
a held-out check of the step-time model and the fit of a convergence model from measured
training curves. Nothing here imports pandas at module load (the simulator imports this module).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sim.cluster import ClusterSpec, NodeSpec
from sim.convergence import ConvergenceModel, ConvergenceParams, convergence_params
from sim.datafiles import atomic_write_text, data_path
from sim.hardware import GPU_MEMORY_GIB, ComputeModel, ComputeParams, compute_params
from sim.network import CommModel, CommParams, comm_params
from sim.validation import check_choice, check_int, check_positive, check_range
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


@dataclass(frozen=True)
class ProfiledNodeSpec(NodeSpec):
    """A node of a worker type measured by a profile (not one of ``GPU_MEMORY_GIB``'s GPUs).

    ``mem_gib`` is the device memory of one worker (for the memory-utilisation signal only).
    """

    mem_gib: float = 16.0

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, str) or not self.gpu.strip():
            raise ValueError(f"node gpu type must be a non-empty name, got {self.gpu!r}")
        check_int(f"gpus on a {self.gpu} node", self.gpus, 1, 4096)
        check_int("cpu_cores", self.cpu_cores, 1)
        check_positive("host_mem_gib", self.host_mem_gib)
        check_positive(f"mem_gib of worker type {self.gpu}", self.mem_gib)


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
    from sim.specs_io import spec_from_dict

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
    cluster = cluster_from_profile_dict(doc["cluster"], memory, where)
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


def cluster_from_profile_dict(
    data: Mapping[str, Any], memory_gib: Mapping[str, float], where: str
) -> ClusterSpec:
    """``{name, nodes: [{gpu, gpus, cpu_cores, host_mem_gib}]}``; a node of a type not in
    ``GPU_MEMORY_GIB`` (or listed in ``memory_gib``) becomes a :class:`ProfiledNodeSpec`."""
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise ValueError(
            f"{where}: cluster must be {{name, nodes: [{{gpu, gpus, ...}}, ...]}} with at least one node"
        )
    allowed = {"gpu", "gpus", "cpu_cores", "host_mem_gib"}
    nodes = []
    for i, n in enumerate(data["nodes"]):
        unknown = [k for k in n if k not in allowed]
        if unknown:
            raise ValueError(
                f"{where}: cluster.nodes[{i}]: unknown key(s) {unknown}; known keys: {sorted(allowed)}"
            )
        gpu = str(n.get("gpu", ""))
        kwargs = {k: n[k] for k in ("gpus", "cpu_cores", "host_mem_gib") if k in n}
        if gpu in memory_gib or gpu not in GPU_MEMORY_GIB:
            if gpu not in memory_gib:
                raise ValueError(
                    f"{where}: worker type {gpu!r} of cluster.nodes[{i}] is not a known GPU "
                    f"({sorted(GPU_MEMORY_GIB)}); give its memory in gpu_memory_gib"
                )
            nodes.append(ProfiledNodeSpec(gpu=gpu, mem_gib=float(memory_gib[gpu]), **kwargs))
        else:
            nodes.append(NodeSpec(gpu=gpu, **kwargs))
    return ClusterSpec(name=str(data.get("name", "profiled")), nodes=tuple(nodes))


def cluster_to_profile_dict(cluster: ClusterSpec) -> dict[str, Any]:
    nodes = [
        {"gpu": n.gpu, "gpus": n.gpus, "cpu_cores": n.cpu_cores, "host_mem_gib": n.host_mem_gib}
        for n in cluster.nodes
    ]
    return {"name": cluster.name, "nodes": nodes}


def jsonable(value: Any) -> Any:
    """Plain JSON: NaN / inf -> None, numpy scalars and arrays -> Python, tuples -> lists."""
    if isinstance(value, float | np.floating):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    return value


def dump_json(doc: Any) -> str:
    return json.dumps(jsonable(doc), indent=2, sort_keys=True, allow_nan=False) + "\n"


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
        "cluster": cluster_to_profile_dict(cluster),
        "workload": asdict(workload),
        "gpu_memory_gib": memory,
        "simulator": dict(simulator or {}),
        **dict(meta or {}),
    }
    atomic_write_text(out / PROFILE_FILE, dump_json(doc))
    return load_profile(out)


# --------------------------------------------------------------------------------------------
# Fitting: sim.fitting's fits, with a floor-free compute model for CPU ranks
# --------------------------------------------------------------------------------------------

#: Why some worker types are fitted without a host floor (``additive_types``).
ADDITIVE_RULE = (
    "host_s held at 0 (T_compute = alpha_s + beta_s * b**exponent) for worker types whose whole step runs "
    "on the device that a slow-down slows: a CPU rank slices its input, runs forward and backward on the "
    "same core, and the real adapter emulates a slower worker by stretching all of it, so no part of the "
    "fixed cost may escape the simulator's gpu_slowdown"
)


def _fit_additive(b: np.ndarray, t: np.ndarray, exponent: float | None) -> tuple[float, float, float, float]:
    """Least squares on log residuals of ``alpha + beta * b**e`` (normalised units, soft_l1 loss with
    :data:`sim.fitting.LOSS_SCALE`, fixed initial guesses): (alpha_s, beta_s, exponent, cost)."""
    from scipy.optimize import least_squares

    from sim.fitting import EXPONENT_BOUNDS, LOSS_SCALE

    ts, bmax = float(np.median(t)), float(b.max())
    x, log_y = b / bmax, np.log(t / ts)
    free = exponent is None

    def unpack(p: np.ndarray) -> tuple[float, float, float]:
        return p[0], p[1], (p[2] if free else float(exponent))

    def residuals(p: np.ndarray) -> np.ndarray:
        a, c, e = unpack(p)
        return np.log(a + c * x**e) - log_y

    slope, intercept = np.polyfit(x, t / ts, 1)
    starts = [(max(float(intercept), 1e-3), max(float(slope), 1e-3))]
    starts.append((0.5 * float(np.min(t / ts)), float(np.max(t / ts))))
    best = None
    for a0, c0 in starts:
        for e0 in (0.75, 1.0, 1.25) if free else (float(exponent),):
            p0 = [a0, c0] + ([e0] if free else [])
            lo = [0.0, 1e-9] + ([EXPONENT_BOUNDS[0]] if free else [])
            hi = [np.inf, np.inf] + ([EXPONENT_BOUNDS[1]] if free else [])
            res = least_squares(
                residuals,
                np.clip(p0, lo, hi),
                bounds=(lo, hi),
                loss="soft_l1",
                f_scale=LOSS_SCALE,
                x_scale="jac",
            )
            if best is None or res.cost < best.cost - 1e-12:
                best = res
    a, c, e = unpack(best.x)
    return a * ts, c * ts / bmax**e, e, float(best.cost)


def _loo_additive(b: np.ndarray, t: np.ndarray, exponent: float | None) -> tuple[float, dict[int, float]]:
    errors = {}
    for i in range(b.size):
        keep = np.arange(b.size) != i
        a, c, e, _ = _fit_additive(b[keep], t[keep], exponent)
        errors[int(b[i])] = abs((a + c * b[i] ** e) / t[i] - 1.0)
    return float(np.median(list(errors.values()))), errors


def fit_compute_additive(
    local_batch: Sequence[float],
    compute_time_s: Sequence[float],
    gpu: str,
    app: str,
    max_batch: int | None = None,
) -> tuple[ComputeParams, dict[str, Any]]:
    """Fit ``T_compute(b) = alpha_s + beta_s * b ** exponent`` with ``host_s = 0`` (:data:`ADDITIVE_RULE`),
    the exponent fixed at 1 or free by :data:`sim.fitting.EXPONENT_RULE` (leave-one-batch-size-out)."""
    from sim.fitting import EXPONENT_MIN_GAIN

    order = np.argsort(np.asarray(local_batch, dtype=np.float64))
    b = np.asarray(local_batch, dtype=np.float64)[order]
    t = np.asarray(compute_time_s, dtype=np.float64)[order]
    if b.size < 2 or np.any(t <= 0) or np.any(b < 1):
        raise ValueError(f"{gpu}/{app}: fitting a compute model needs >= 2 batch sizes >= 1 with times > 0")
    if b.size >= 3:
        fixed, fixed_per = _loo_additive(b, t, 1.0)
        free, free_per = _loo_additive(b, t, None)
    else:
        fixed = free = math.nan
        fixed_per = free_per = {}
    use_free = bool(free <= (1.0 - EXPONENT_MIN_GAIN) * fixed)
    a, c, e, _ = _fit_additive(b, t, None if use_free else 1.0)
    rel = (a + c * b**e) / t - 1.0
    params = ComputeParams(
        gpu=gpu, app=app, alpha_s=a, beta_s=c, exponent=e, host_s=0.0, k=1.0,
        max_batch=int(max_batch if max_batch is not None else b.max()),
        loo_mdape=free if use_free else fixed, fit_mape=float(np.mean(np.abs(rel))),
    )  # fmt: skip
    report = {
        "exponent_mode": "free" if use_free else "fixed",
        "loo_mdape_fixed": fixed,
        "loo_mdape_free": free,
        "loo_per_batch": free_per if use_free else fixed_per,
        "residual_per_batch": {int(bb): float(r) for bb, r in zip(b, rel, strict=True)},
        "host_floor": ADDITIVE_RULE,
    }
    return params, report


def fit_models(
    table: Any, additive_types: Sequence[str] = (), host_floor_pairs: Sequence[tuple[str, str]] = ()
) -> tuple[list[ComputeParams], list[CommParams], dict[tuple[str, str], dict[str, Any]]]:
    """:func:`sim.fitting.fit_all`, except that worker types in ``additive_types`` get
    :func:`fit_compute_additive` (and their all-reduce model refitted to it with
    :func:`sim.fitting.fit_comm_report`)."""
    from sim.fitting import compute_times, fit_all, fit_comm_report, read_profile_table

    df = read_profile_table(table)
    computes, comms, diags = fit_all(df, host_floor_pairs)
    add = set(additive_types)
    if not add:
        return computes, comms, diags
    cmap = {(p.gpu, p.app): p for p in computes}
    nmap = {(p.gpu, p.app): p for p in comms}
    for (gpu, app), pair in df.groupby(["gpu", "app"], sort=True):
        if gpu not in add:
            continue
        times = compute_times(pair).dropna(subset=["compute_time_s"])
        params, rep = fit_compute_additive(
            times["local_batch"], times["compute_time_s"], str(gpu), str(app), int(pair["local_batch"].max())
        )
        cmap[(gpu, app)] = params
        diags[(gpu, app)].update(rep, alpha_held_zero=False)
        if (pair["num_gpus"] > 1).any():
            comm, crep = fit_comm_report(pair, params)
            nmap[(gpu, app)] = comm
            diags[(gpu, app)]["comm"] = crep.__dict__
    return [cmap[k] for k in sorted(cmap)], [nmap[k] for k in sorted(nmap)], diags


# --------------------------------------------------------------------------------------------
# Step-time predictions and the held-out check
# --------------------------------------------------------------------------------------------


def step_time_s(
    compute: ComputeParams,
    comm: CommParams | None,
    local_batch: np.ndarray | float,
    replicas: int,
    nodes: int = 1,
) -> np.ndarray:
    """The simulator's noise-free step time with every one of ``replicas`` workers at ``local_batch``:
    ``smooth_max_gamma(T_compute(b), T_sync(R, nodes))`` (``T_compute`` alone for one replica)."""
    t_comp = ComputeModel(compute).compute_time_s(local_batch)
    if replicas <= 1 or comm is None:
        return np.asarray(t_comp, dtype=np.float64)
    model = CommModel([comm], replicas, nodes, model_bytes=0.0)
    return model.iteration_time_s(t_comp, model.sync_time_s())


def holdout_split(table: Any, every: int = 2) -> tuple[Any, Any]:
    """Split a validated profile table by local batch: per (gpu, app), of the distinct batches in
    ascending order, every ``every``-th starting with the second is held out, except the largest
    (so held-out batches are interpolated, never extrapolated). Returns (fit rows, held-out rows)."""
    check_int("holdout every", every, 2)
    held = np.zeros(len(table), dtype=bool)
    for _, pair in table.groupby(["gpu", "app"], sort=True):
        batches = np.sort(pair["local_batch"].unique())
        out = set(batches[1:-1:every].tolist())
        held[pair.index[pair["local_batch"].isin(out)]] = True
    return table[~held].reset_index(drop=True), table[held].reset_index(drop=True)


def holdout_errors(
    table: Any,
    every: int = 2,
    host_floor_pairs: Sequence[tuple[str, str]] = (),
    additive_types: Sequence[str] = (),
) -> dict[str, Any]:
    """Fit on part of the batch ladder and predict the rest (see :func:`holdout_split`).

    The fit is :func:`fit_models` on the kept rows; every held-out row's step time is predicted
    with :func:`step_time_s`.

    Returns:
        ``rows`` (one dict per held-out row: gpu, app, workers, local batch, measured and
        predicted step time, APE) and ``mdape`` per worker type (a fraction), plus the pooled
        ``mdape_all``.
    """
    from sim.fitting import read_profile_table

    df = read_profile_table(table)
    fit_rows, test_rows = holdout_split(df, every)
    if test_rows.empty:
        raise ValueError(
            "the batch ladder is too short to hold batches out: it needs at least 3 local batches per pair"
        )
    computes, comms, _ = fit_models(fit_rows, additive_types, host_floor_pairs)
    cmap = {(p.gpu, p.app): p for p in computes}
    nmap = {(p.gpu, p.app): p for p in comms}
    rows = []
    for r in test_rows.itertuples(index=False):
        key = (r.gpu, r.app)
        pred = float(step_time_s(cmap[key], nmap.get(key), r.local_batch, int(r.num_gpus), int(r.num_nodes)))
        rows.append({
            "gpu": r.gpu, "app": r.app, "workers": int(r.num_gpus), "nodes": int(r.num_nodes),
            "local_batch": int(r.local_batch), "measured_s": float(r.step_time_s), "predicted_s": pred,
            "ape": abs(pred / float(r.step_time_s) - 1.0),
        })  # fmt: skip
    by_gpu: dict[str, list[float]] = {}
    for row in rows:
        by_gpu.setdefault(row["gpu"], []).append(row["ape"])
    return {
        "rows": rows,
        "mdape": {g: float(np.median(v)) for g, v in sorted(by_gpu.items())},
        "mdape_all": float(np.median([r["ape"] for r in rows])),
        "fit_batches": sorted({int(b) for b in fit_rows["local_batch"]}),
        "held_out_batches": sorted({int(b) for b in test_rows["local_batch"]}),
        "fit": {"compute": computes, "comm": comms},
    }


# --------------------------------------------------------------------------------------------
# Convergence model from measured training curves
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """One static-batch training run as measured interval by interval.

    ``progress`` is in base-batch steps (the learning-rate gain summed over the steps, as the
    simulator counts it); ``grad_sqr`` and ``grad_var`` are |G|^2 and tr(Sigma) / M0 (the
    simulator's convention, see :mod:`sim.convergence`).
    """

    global_batch: int
    steps: np.ndarray
    progress: np.ndarray
    val_accuracy: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray
    train_accuracy: np.ndarray | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("curve global_batch", self.global_batch, 1)
        n = len(self.steps)
        for f in ("progress", "val_accuracy", "grad_sqr", "grad_var"):
            if len(getattr(self, f)) != n:
                raise ValueError(
                    f"curve at global batch {self.global_batch}: {f} has {len(getattr(self, f))} points, steps {n}"
                )
        if n < 2:
            raise ValueError(f"curve at global batch {self.global_batch} needs at least 2 points, got {n}")
        if np.any(np.diff(self.progress) <= 0):
            raise ValueError(f"curve at global batch {self.global_batch}: progress must increase strictly")


@dataclass
class ConvergenceFit:
    params: ConvergenceParams
    rmse_binned: float  # accuracy RMSE on the binned curves (what was fitted)
    rmse_raw: float  # accuracy RMSE on every measured point
    rmse_by_batch: dict[int, float]
    steps_to_target: list[dict[str, Any]]  # measured vs model steps to each target, per curve
    grad_rmse_log_noise: float
    notes: list[str] = field(default_factory=list)


def _bin_curves(curves: Sequence[Curve], bins: int) -> tuple[np.ndarray, list[Any]]:
    from sim.fit_convergence import Trace

    p_end = min(float(c.progress[-1]) for c in curves)
    p_start = max(float(c.progress[0]) for c in curves)
    if p_end <= p_start:
        raise ValueError("the curves share no progress range: run each longer (curves.progress)")
    grid = np.unique(
        np.concatenate(
            [np.geomspace(p_start, p_end, bins // 2), np.linspace(p_start, p_end, bins - bins // 2)]
        )
    )
    traces = []
    for c in curves:
        lg = np.log(np.maximum(c.grad_sqr, 1e-30))
        lv = np.log(np.maximum(c.grad_var, 1e-30))
        traces.append(
            Trace(
                app="measured",
                global_batch=int(c.global_batch),
                epoch=np.arange(1, len(grid) + 1, dtype=np.float64),
                progress=grid.copy(),
                iteration=np.interp(grid, c.progress, c.steps),
                metric=np.interp(grid, c.progress, c.val_accuracy),
                grad_sqr=np.exp(np.interp(grid, c.progress, lg)),
                grad_var=np.exp(np.interp(grid, c.progress, lv)),
            )
        )
    return grid, traces


def _merge_curves(curves: Sequence[Curve], bins: int) -> tuple[np.ndarray, list[Any]]:
    """Bin the curves (see :func:`_bin_curves`) and average the seeds of each global batch."""
    grid, traces = _bin_curves(curves, bins)
    merged = []
    for m in sorted({c.global_batch for c in curves}):
        group = [t for t in traces if t.global_batch == m]
        merged.append(
            replace(
                group[0],
                iteration=np.mean([t.iteration for t in group], axis=0),
                metric=np.mean([t.metric for t in group], axis=0),
                grad_sqr=np.exp(np.mean([np.log(t.grad_sqr) for t in group], axis=0)),
                grad_var=np.exp(np.mean([np.log(t.grad_var) for t in group], axis=0)),
            )
        )
    return grid, merged


def _grad_only(grad: Any, name: str, base_batch: int, acc_chance: float, total: float) -> ConvergenceParams:
    """Fitted gradient statistics with a placeholder accuracy shape (for stepping progress only)."""
    return ConvergenceParams(
        name=name, base_batch=int(base_batch), total_progress=total, progress_knots=grad.progress_knots,
        log_grad_sqr=grad.log_grad_sqr, log_grad_var=grad.log_grad_var, acc_chance=acc_chance,
        acc_ceiling=1.0, ref_batch=float(base_batch), gap_per_doubling=0.0, stretch_exponent=0.0,
        shape_x=(0.0, total), shape_y=(0.0, 1.0), batch_memory_progress=total,
    )  # fmt: skip


def simulated_progress(model: ConvergenceModel, curve: Curve) -> np.ndarray:
    """The progress the simulator would count for ``curve``'s steps at its global batch: each
    measured interval of ``n`` steps advances ``n * r(M, p + n r(M, p) / 2)`` (the engine's midpoint rule)."""
    m = float(curve.global_batch)
    p, out = 0.0, []
    for n in np.diff(np.concatenate([[0.0], curve.steps])):
        r1 = model.progress_per_step(m, p)
        p += n * model.progress_per_step(m, p + 0.5 * n * r1)
        out.append(p)
    return np.array(out)


def _measured_steps(curves: Sequence[Curve], target: float) -> dict[int, float]:
    """Median over seeds of the first measured step count at which each batch reaches ``target``
    (batches with a seed that never does are left out)."""
    out = {}
    for m in sorted({c.global_batch for c in curves}):
        hits = []
        for c in curves:
            if c.global_batch == m:
                h = np.nonzero(c.val_accuracy >= target)[0]
                hits.append(float(c.steps[h[0]]) if len(h) else math.nan)
        if hits and not any(math.isnan(x) for x in hits):
            out[m] = float(np.median(hits))
    return out


def _refit_time_to_target(
    params: ConvergenceParams, curves: Sequence[Curve], targets: Sequence[float]
) -> tuple[ConvergenceParams, str]:
    """Refit the batch dependence of the time to the targets: the shape's progress scale and the
    stretch exponent, by least squares on log steps-to-target (model vs the measured medians), as
    :func:`sim.fit_convergence.fit_tradeoff` fits minutes to peak. The shape, ceiling and
    gradient statistics stay those of the curve fit."""
    from scipy.optimize import least_squares

    from sim.fit_convergence import progress_to_accuracy, steps_to_progress

    pairs = [(m, a, n) for a in targets for m, n in _measured_steps(curves, a).items()]
    if len({m for m, _, _ in pairs}) < 2:
        return params, "time-to-target refit skipped: fewer than two batches reach the targets in every seed"

    def make(z: np.ndarray) -> ConvergenceParams:
        return replace(
            params,
            shape_x=tuple(float(np.exp(z[0])) * x for x in params.shape_x),
            stretch_exponent=float(z[1]),
        )

    def residuals(z: np.ndarray) -> np.ndarray:
        model = ConvergenceModel(make(z), "adascale")
        out = []
        for m, a, n in pairs:
            p = progress_to_accuracy(model, m, a)
            out.append(math.log(steps_to_progress(model, m, p) / n) if math.isfinite(p) else 5.0)
        return np.array(out)

    z0 = np.array([0.0, params.stretch_exponent])
    before = float(np.sqrt(np.mean(residuals(z0) ** 2)))
    best = None
    for s0 in (0.0, params.stretch_exponent, 0.5):
        sol = least_squares(residuals, [0.0, s0], bounds=([math.log(0.2), 0.0], [math.log(5.0), 2.0]))
        if best is None or sol.cost < best.cost - 1e-12:
            best = sol
    after = float(np.sqrt(np.mean(best.fun**2)))
    if after >= before:
        return params, f"time-to-target refit kept the curve fit (RMS log error {before:.3f})"
    out = make(best.x)
    return out, (
        f"time-to-target refit at {list(targets)}: shape progress x{math.exp(best.x[0]):.3f}, stretch exponent "
        f"{params.stretch_exponent:.3f} -> {out.stretch_exponent:.3f}; RMS log error of steps to target "
        f"{before:.3f} -> {after:.3f} over {len(pairs)} (batch, target) points"
    )


def fit_convergence_curves(
    curves: Sequence[Curve],
    *,
    name: str,
    base_batch: int,
    acc_chance: float,
    memory_fraction: float = 0.1,
    bins: int = 24,
    targets: Sequence[float] = (),
    resimulate_progress: int = 2,
    refit_targets: Sequence[float] = (),
) -> ConvergenceFit:
    """Fit :class:`ConvergenceParams` to measured static-batch curves with
    :mod:`sim.fit_convergence`'s machinery (gradient statistics, then the accuracy shape, ceiling,
    gap and stretch by weighted least squares).

    The curves are binned on a common progress grid (``bins`` points, half geometric, half linear,
    over the progress range every curve covers), which plays the part of the reference traces'
    epochs. Curves at the same global batch (several seeds) are averaged bin by bin first.

    Args:
        curves: static runs, at least two distinct global batches.
        name: the model's name (the workload's ``convergence`` key).
        base_batch: M0 of the real learning-rate scaling (progress unit).
        acc_chance: accuracy of an untrained model (1 / classes).
        memory_fraction: batch-memory time constant as a fraction of the fitted progress range.
        bins: progress bins.
        targets: accuracies for the steps-to-target comparison (model vs each measured curve).
        resimulate_progress: rounds of re-expressing each curve's progress in the simulator's
            units (the AdaScale gain with the fitted noise scale, integrated over the measured steps)
            and refitting the gradient statistics. The measured progress sums the real backend's
            gains, which use its noisy noise-scale estimate (biased low at large batches); in the
            simulator's units a simulated static run reaches each accuracy after as many steps as
            the measured one. 0 keeps the measured progress.
        refit_targets: accuracies at which the batch dependence is refitted to the measured steps
            (:func:`_refit_time_to_target`); empty: the least-squares fit of the curves alone.
    """
    from sim.fit_convergence import (
        accuracy_rmse,
        fit_accuracy,
        fit_grad_stats,
        progress_to_accuracy,
        steps_to_progress,
    )

    check_range("acc_chance", acc_chance, 0.0, 1.0)
    check_range("memory_fraction", memory_fraction, 0.0, 1.0, low_open=True)
    check_int("bins", bins, 4)
    batches = sorted({c.global_batch for c in curves})
    if len(batches) < 2:
        raise ValueError(
            f"fitting a convergence model needs curves at 2 or more global batches, got {batches}"
        )
    grid, merged = _merge_curves(curves, bins)
    grad = fit_grad_stats(merged, base_batch)
    for _ in range(resimulate_progress):
        # Progress in the simulator's own units: r_ada with the fitted noise scale, step by step.
        stepper = ConvergenceModel(
            _grad_only(grad, name, base_batch, acc_chance, float(grid[-1])), "adascale"
        )
        curves = [replace(c, progress=simulated_progress(stepper, c)) for c in curves]
        grid, merged = _merge_curves(curves, bins)
        grad = fit_grad_stats(merged, base_batch)
    acc = fit_accuracy(merged, acc_chance, ref_batch=float(batches[0]))
    total = float(grid[-1])
    train_gaps = [
        float(np.mean(c.train_accuracy[-3:] - c.val_accuracy[-3:]))
        for c in curves
        if c.train_accuracy is not None
    ]
    train_gap = float(np.clip(np.mean(train_gaps), 0.0, 1.0)) if train_gaps else 0.0
    params = ConvergenceParams(
        name=name,
        base_batch=int(base_batch),
        total_progress=total,
        progress_knots=grad.progress_knots,
        log_grad_sqr=grad.log_grad_sqr,
        log_grad_var=grad.log_grad_var,
        acc_chance=acc_chance,
        acc_ceiling=acc.acc_ceiling,
        ref_batch=float(batches[0]),
        gap_per_doubling=acc.gap_per_doubling,
        stretch_exponent=acc.stretch_exponent,
        shape_x=acc.shape_x,
        shape_y=acc.shape_y,
        batch_memory_progress=memory_fraction * total,
        train_gap=train_gap,
    )
    notes = []
    if refit_targets:
        params, note = _refit_time_to_target(params, curves, refit_targets)
        notes.append(note)
    model = ConvergenceModel(params, "adascale")
    rmse = accuracy_rmse(model, merged)
    params = replace(params, fit_rmse=rmse["all"])
    raw_res, by_batch = [], {}
    for m in batches:
        res = []
        for c in curves:
            if c.global_batch == m:
                res.append(model.accuracy_many(c.progress, math.log2(m)) - c.val_accuracy)
        r = np.concatenate(res)
        by_batch[m] = float(np.sqrt(np.mean(r**2)))
        raw_res.append(r)
    stt = []
    for target in targets:
        for c in curves:
            hit = np.nonzero(c.val_accuracy >= target)[0]
            measured = float(c.steps[hit[0]]) if len(hit) else math.nan
            p = progress_to_accuracy(model, c.global_batch, target)
            predicted = steps_to_progress(model, c.global_batch, p) if math.isfinite(p) else math.inf
            stt.append({
                "target": target, "global_batch": c.global_batch, "seed": c.seed,
                "measured_steps": measured, "model_steps": predicted,
                "rel_error": predicted / measured - 1.0 if math.isfinite(predicted) and measured > 0 else math.nan,
            })  # fmt: skip
    notes.insert(
        0,
        f"{len(curves)} curves at global batches {batches}; binned on {len(grid)} progress points in "
        f"[{grid[0]:.3g}, {grid[-1]:.3g}] base-batch steps; curves at the same batch averaged per bin",
    )
    return ConvergenceFit(
        params=params,
        rmse_binned=float(rmse["all"]),
        rmse_raw=float(np.sqrt(np.mean(np.concatenate(raw_res) ** 2))),
        rmse_by_batch=by_batch,
        steps_to_target=stt,
        grad_rmse_log_noise=float(grad.rmse_log_noise_rows),
        notes=notes,
    )
