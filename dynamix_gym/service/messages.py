"""Wire messages <-> the project's types, and the validation every incoming field goes through.

The service trusts nothing a client sends: a registration's spec and every interval report are
checked field by field (finite, within the range below, one entry per registered worker) before
they reach the encoder, the policy or the learner's log. A violation raises :class:`FieldError`,
which names the field and the allowed range; the server turns it into ``INVALID_ARGUMENT``.

Ranges of a report's fields (every value must be finite): the table :func:`range_table` makes
from :class:`~sim.protocol.IntervalReport`'s field metadata, put here at import (``help()`` shows
it; no copy is kept by hand).
"""

from __future__ import annotations

import math
import re

import numpy as np

from dynamix_gym.controllers.bundle import BundleMismatchError
from dynamix_gym.obs import SCHEMA_VERSIONS
from dynamix_gym.service import arbitrator_pb2 as pb
from sim.protocol import (
    FIELD_DTYPES,
    FIELD_RANGES,
    MAX_BATCH,
    MAX_COMPUTE_CURVE_POINTS,
    MAX_WORKERS,
    SCALAR_FIELDS,
    WORKER_FIELDS,
    BackendSpec,
    IntervalReport,
)
from sim.scaling import LR_RULES

JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

#: Per-worker float fields of a report and their allowed [low, high] (from the report's metadata).
WORKER_RANGES: dict[str, tuple[float, float]] = {
    name: FIELD_RANGES[name] for name in WORKER_FIELDS if FIELD_DTYPES[name] is np.float64
}
#: Global fields of a report and their allowed [low, high] (from the report's metadata).
SCALAR_RANGES: dict[str, tuple[float, float]] = {name: FIELD_RANGES[name] for name in SCALAR_FIELDS}
_INT_SCALARS = frozenset(name for name in SCALAR_FIELDS if FIELD_DTYPES[name] is int)

_W_LOW = np.array([[lo] for lo, _ in WORKER_RANGES.values()])
_W_HIGH = np.array([[hi] for _, hi in WORKER_RANGES.values()])


def range_table() -> str:
    """Markdown table of every report field on the wire and the range the service accepts."""
    lines = ["| field | per worker | allowed |", "|---|---|---|"]
    for name in WORKER_FIELDS + SCALAR_FIELDS:
        if FIELD_DTYPES[name] is np.bool_:
            allowed = "true / false"
        elif name not in FIELD_RANGES:  # the local batch: the registered spec's range, per worker
            allowed = "[min_batch_i, max_batch_i] of the registered spec"
        else:
            low, high = FIELD_RANGES[name]
            allowed = f"[{low:g}, {high:g}]" + (" (integer)" if name in _INT_SCALARS else "")
        lines.append(f"| {name} | {'yes' if name in WORKER_FIELDS else 'no'} | {allowed} |")
    return "\n".join(lines)


if __doc__ is not None:  # python -OO strips docstrings
    __doc__ += "\n" + range_table() + "\n"


class FieldError(ValueError):
    """An incoming field is missing, of the wrong size or outside its allowed range."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _in_range(field: str, values: np.ndarray, low: float, high: float) -> None:
    if not np.all(np.isfinite(values)):
        raise FieldError(field, f"must be finite, got {values[~np.isfinite(values)][:3].tolist()}")
    bad = (values < low) | (values > high)
    if np.any(bad):
        raise FieldError(field, f"must lie in [{low:g}, {high:g}], got {values[bad][:3].tolist()}")


def _sized(field: str, values, n: int, dtype) -> np.ndarray:
    if len(values) != n:
        raise FieldError(field, f"needs one entry per registered worker ({n}), got {len(values)}")
    return np.asarray(values, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------
def spec_to_proto(spec: BackendSpec) -> pb.ClusterSpec:
    return pb.ClusterSpec(
        gpu_types=list(spec.gpu_types),
        node_of_worker=[int(x) for x in spec.node_of_worker],
        min_batch=spec.min_batch.tolist(),
        max_batch=spec.max_batch.tolist(),
        initial_batch=spec.initial_batch.tolist(),
        base_batch=int(spec.base_batch),
        target_accuracy=float(spec.target_accuracy),
        time_budget_s=float(spec.time_budget_s) if math.isfinite(spec.time_budget_s) else 0.0,
        num_classes=int(spec.num_classes),
        lr_rule=spec.lr_rule,
        compute_curve_s=[] if spec.compute_curve_s is None else spec.compute_curve_s.ravel().tolist(),
    )


def check_register(req: pb.RegisterRequest) -> None:
    """Refuse a registration whose job id, schema, interval or spec is malformed."""
    if not JOB_ID.match(req.job_id):
        raise FieldError("job_id", f"must be 1-64 characters of [A-Za-z0-9._-], got {req.job_id[:80]!r}")
    if req.schema_version and req.schema_version not in SCHEMA_VERSIONS:
        raise FieldError(
            "schema_version",
            f"the service encodes observation schemas {list(SCHEMA_VERSIONS)} ('': the served "
            f"bundle's own), the job asks for {req.schema_version[:16]!r}; run a client (dynamix_gym) "
            "of the service's version",
        )
    if not 1 <= req.interval <= 100_000:
        raise FieldError("interval", f"must lie in [1, 100000] iterations, got {req.interval}")
    if len(req.workload) > 64 or len(req.task) > 128 or len(req.bundle) > 64:
        raise FieldError("workload/task/bundle", "names are at most 64 / 128 / 64 characters")
    if req.next_seq > 1 << 40:
        raise FieldError("next_seq", f"must lie in [0, 2^40], got {req.next_seq}")


def check_bundle_schema(requested: str, bundle: str, bundle_schema: str) -> None:
    """Refuse (:class:`BundleMismatchError`: ``FAILED_PRECONDITION``) a job that registered for an
    observation schema the served bundle does not read; ``""`` accepts the bundle's own."""
    if requested and requested != bundle_schema:
        raise BundleMismatchError(
            f"bundle {bundle!r} reads observation schema {bundle_schema}; the job registered for "
            f"schema {requested} (register with schema_version {bundle_schema!r}, or '' for the bundle's own)"
        )


def spec_from_proto(msg: pb.ClusterSpec, workload: str) -> BackendSpec:
    """A :class:`BackendSpec` from a registration, every field checked."""
    n = len(msg.gpu_types)
    if not 1 <= n <= MAX_WORKERS:
        raise FieldError("spec.gpu_types", f"a job has 1 to {MAX_WORKERS} workers, got {n}")
    if any(len(g) > 64 for g in msg.gpu_types):
        raise FieldError("spec.gpu_types", "GPU type names are at most 64 characters")
    node = _sized("spec.node_of_worker", msg.node_of_worker, n, np.int64)
    _in_range("spec.node_of_worker", node.astype(np.float64), 0, MAX_WORKERS)
    arrays = {}
    for name in ("min_batch", "max_batch", "initial_batch"):
        arr = _sized(f"spec.{name}", getattr(msg, name), n, np.int64)
        _in_range(f"spec.{name}", arr.astype(np.float64), 1, MAX_BATCH)
        arrays[name] = arr
    if np.any(arrays["min_batch"] > arrays["max_batch"]):
        raise FieldError("spec.min_batch", "must not exceed max_batch on any worker")
    lo, hi = arrays["min_batch"], arrays["max_batch"]
    init = arrays["initial_batch"]
    if np.any((init < lo) | (init > hi)):
        raise FieldError("spec.initial_batch", "must lie in [min_batch, max_batch] on every worker")
    if not 1 <= msg.base_batch <= MAX_BATCH:
        raise FieldError("spec.base_batch", f"must lie in [1, {MAX_BATCH}], got {msg.base_batch}")
    if not (math.isfinite(msg.target_accuracy) and 0.0 < msg.target_accuracy <= 1.0):
        raise FieldError("spec.target_accuracy", f"must lie in (0, 1], got {msg.target_accuracy}")
    budget = msg.time_budget_s
    if not math.isfinite(budget) or not 0.0 <= budget <= 1e9:
        raise FieldError("spec.time_budget_s", f"must lie in [0, 1e9] s (0: no budget), got {budget}")
    if not 2 <= msg.num_classes <= 1_000_000:
        raise FieldError("spec.num_classes", f"must lie in [2, 1000000], got {msg.num_classes}")
    lr_rule = msg.lr_rule or "adascale"
    if lr_rule not in LR_RULES:
        raise FieldError("spec.lr_rule", f"must be one of {list(LR_RULES)} (or empty: adascale)")
    curve = None
    if len(msg.compute_curve_s):  # workers x points, row-major; schema 4 reads it
        points, rest = divmod(len(msg.compute_curve_s), n)
        if rest or not 2 <= points <= MAX_COMPUTE_CURVE_POINTS:
            raise FieldError(
                "spec.compute_curve_s",
                f"needs 2 to {MAX_COMPUTE_CURVE_POINTS} points per worker ({n} workers, row-major), got "
                f"{len(msg.compute_curve_s)} values",
            )
        curve = np.asarray(msg.compute_curve_s, dtype=np.float64).reshape(n, points)
        _in_range("spec.compute_curve_s", curve.ravel(), 1e-9, 1e6)
    return BackendSpec(
        gpu_types=tuple(msg.gpu_types),
        node_of_worker=tuple(int(x) for x in node),
        min_batch=lo,
        max_batch=hi,
        initial_batch=init,
        base_batch=int(msg.base_batch),
        target_accuracy=float(msg.target_accuracy),
        time_budget_s=float(budget) if budget > 0 else math.inf,
        num_classes=int(msg.num_classes),
        workload=workload or "user",
        deterministic=False,
        lr_rule=lr_rule,
        compute_curve_s=curve,
    )


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------
def report_to_proto(report: IntervalReport) -> pb.IntervalReport:
    """The wire form of ``report``: every field of the report's metadata (``events`` and ``truth``
    stay with the backend)."""
    msg = pb.IntervalReport()
    for name in WORKER_FIELDS:
        getattr(msg, name).extend(np.asarray(getattr(report, name), dtype=FIELD_DTYPES[name]).tolist())
    for name in SCALAR_FIELDS:
        setattr(msg, name, FIELD_DTYPES[name](getattr(report, name)))
    return msg


def report_from_proto(msg: pb.IntervalReport, spec: BackendSpec) -> IntervalReport:
    """An :class:`IntervalReport` from the wire, every field checked against ``spec``."""
    n = spec.num_workers
    batch = _sized("report.local_batch", msg.local_batch, n, np.int64)
    out_of_range = (batch < spec.min_batch) | (batch > spec.max_batch)
    if np.any(out_of_range):
        i = int(np.argmax(out_of_range))
        raise FieldError(
            "report.local_batch",
            f"worker {i} reports {int(batch[i])}, its registered range is "
            f"[{int(spec.min_batch[i])}, {int(spec.max_batch[i])}]",
        )
    alive = _sized("report.alive", msg.alive, n, bool)
    for name in WORKER_RANGES:
        if len(getattr(msg, name)) != n:
            _sized(f"report.{name}", getattr(msg, name), n, np.float64)
    # One vectorised check of every per-worker float field; the field is named on failure.
    block = np.array([getattr(msg, name) for name in WORKER_RANGES], dtype=np.float64)
    if not (np.isfinite(block).all() and (block >= _W_LOW).all() and (block <= _W_HIGH).all()):
        for row, (name, (low, high)) in zip(block, WORKER_RANGES.items(), strict=True):
            _in_range(f"report.{name}", row, low, high)
    arrays = dict(zip(WORKER_RANGES, block, strict=True))
    values = [float(getattr(msg, name)) for name in SCALAR_RANGES]
    for (name, (low, high)), v in zip(SCALAR_RANGES.items(), values, strict=True):
        if not (low <= v <= high):  # False for NaN too
            _in_range(f"report.{name}", np.array([v]), low, high)
    scalars = {
        name: int(v) if name in _INT_SCALARS else v for name, v in zip(SCALAR_RANGES, values, strict=True)
    }
    if scalars["interval_time_s"] <= 0.0:
        raise FieldError("report.interval_time_s", "must be > 0 s")
    return IntervalReport(local_batch=batch, alive=alive, **arrays, **scalars, truth=None)


def batches_from_proto(field: str, values, spec: BackendSpec) -> np.ndarray:
    arr = _sized(field, values, spec.num_workers, np.int64)
    if np.any((arr < spec.min_batch) | (arr > spec.max_batch)):
        raise FieldError(field, "must lie in the registered [min_batch, max_batch] on every worker")
    return arr
