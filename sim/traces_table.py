"""Reading a user's convergence traces (the reference format) for a workload the project has not seen.

The format is that of ``sim/data/reference/convergence_traces.csv`` (see the README there): one row
per (global batch, epoch) of static-batch runs, columns ``[app], [model], global_batch, epoch,
progress, iteration, metric, grad_sqr, grad_var``. The ``metric`` column is in the workload's own
units; :class:`sim.workloads.QualityMetric` says how it maps to the rising quality fraction the
convergence model fits (so a falling WER or loss is read as ``1 - value * scale``).

:func:`read_traces` rejects an ill-formed table with a message naming the file, the column and the
row (and the allowed range): a missing column, a non-numeric or non-finite cell, a metric outside
the range its scale declares, a negative ``grad_sqr`` or a non-positive ``grad_var``, progress that
does not increase within a run, or runs at a single global batch (the batch dependence cannot be
fitted from one). A ``grad_sqr`` of 0 is accepted: Pollux / AdaptDL clip their squared-gradient
estimate at 0 (and the variance estimate at 1e-6), so late epochs, where |G|^2 sinks below the
estimate's noise, carry zeros; the noise-scale fit leaves those rows out and its report lists them
(:func:`sim.fitting.convergence.fit_grad_stats`).
:func:`app_spec` turns a workload's metric into what :func:`sim.fitting.convergence.fit_app` needs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.fitting.convergence import AppSpec, Trace, common_epochs
from sim.workloads import Workload

#: Columns a traces table must have (``app`` and ``model`` are optional).
TRACE_COLUMNS: tuple[str, ...] = (
    "global_batch",
    "epoch",
    "progress",
    "iteration",
    "metric",
    "grad_sqr",
    "grad_var",
)
#: Quality steps below the workload's target at which epochs-to-target are also ranked.
TARGET_STEPS: tuple[float, ...] = (0.02, 0.01, 0.0)


def read_traces(path: str | Path, workload: Workload) -> list[Trace]:
    """The static-batch runs of ``workload`` in the traces table at ``path``, metric as quality.

    Rows whose ``app`` (if the column exists) is not ``workload.app`` are skipped; a table without
    an ``app`` column holds one application.

    Returns:
        One :class:`~sim.fitting.convergence.Trace` per global batch, sorted by batch and by epoch
        within each, ``metric`` mapped to the quality fraction.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an ill-formed table (see the module docstring); the message names the file,
            the column and the row (1-based data rows; line = row + 1).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"convergence traces {str(path)!r} do not exist")
    name = path.name
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise ValueError(
                f"convergence traces {name} lack required column(s) {missing}; "
                f"required: {list(TRACE_COLUMNS)}, found: {header}"
            )
        rows = list(reader)
    where = lambda i: f"row {i + 1} (line {i + 2}) of {name}"  # noqa: E731
    if "app" in header:
        apps = sorted({(r["app"] or "").strip() for r in rows})
        keep = [i for i, r in enumerate(rows) if (r["app"] or "").strip() == workload.app]
        if not keep:
            raise ValueError(
                f"convergence traces {name} have no rows with app {workload.app!r} (column app holds {apps})"
            )
    else:
        keep = list(range(len(rows)))
    if not keep:
        raise ValueError(f"convergence traces {name} have no rows")

    values: dict[str, np.ndarray] = {}
    for col in TRACE_COLUMNS:
        out = np.empty(len(keep))
        for j, i in enumerate(keep):
            raw = rows[i][col]
            try:
                v = float(raw)
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v):
                raise ValueError(f"{col} in {where(i)} must be a finite number, got {raw!r}")
            out[j] = v
        values[col] = out

    def fail(col: str, j: int, rule: str) -> None:
        raise ValueError(f"{col} in {where(keep[j])} must be {rule}, got {rows[keep[j]][col]!r}")

    for col in ("global_batch", "epoch"):
        v = values[col]
        bad = np.flatnonzero((v != np.round(v)) | (v < 1))
        if bad.size:
            fail(col, int(bad[0]), "an integer >= 1")
    for col, rule in (("progress", "> 0"), ("grad_var", "> 0")):
        bad = np.flatnonzero(values[col] <= 0)
        if bad.size:
            fail(col, int(bad[0]), rule)
    bad = np.flatnonzero(values["grad_sqr"] < 0)
    if bad.size:
        fail(
            "grad_sqr", int(bad[0]), ">= 0 (0: an estimate clipped at zero, left out of the noise-scale fit)"
        )
    bad = np.flatnonzero(values["iteration"] < 0)
    if bad.size:
        fail("iteration", int(bad[0]), ">= 0")
    m = workload.metric
    lo, hi = m.value_range
    bad = np.flatnonzero((values["metric"] < lo) | (values["metric"] > hi))
    if bad.size:
        fail(
            "metric", int(bad[0]),
            f"in [{lo:g}, {hi:g}] (workload {workload.name}'s {m.name}, scale {m.scale:g}: "
            "a fraction in [0, 1])",
        )  # fmt: skip

    batches = values["global_batch"].astype(np.int64)
    distinct = sorted(set(batches.tolist()))
    if len(distinct) < 2:
        raise ValueError(
            f"global_batch in {name} (rows {keep[0] + 1}-{keep[-1] + 1}) holds a single batch size "
            f"{distinct}: fitting how the batch size changes convergence needs runs at 2 or more"
        )
    traces = []
    for b in distinct:
        idx = np.flatnonzero(batches == b)
        idx = idx[np.argsort(values["epoch"][idx], kind="stable")]
        ep = values["epoch"][idx]
        dup = np.flatnonzero(np.diff(ep) == 0)
        if dup.size:
            fail("epoch", int(idx[dup[0] + 1]), f"unique within global_batch {b} (repeated)")
        prog = values["progress"][idx]
        back = np.flatnonzero(np.diff(prog) <= 0)
        if back.size:
            fail("progress", int(idx[back[0] + 1]), f"increasing with epoch within global_batch {b}")
        traces.append(
            Trace(
                app=workload.app,
                global_batch=int(b),
                epoch=ep,
                progress=prog,
                iteration=values["iteration"][idx],
                metric=np.asarray(m.to_quality(values["metric"][idx]), dtype=np.float64),
                grad_sqr=values["grad_sqr"][idx],
                grad_var=values["grad_var"][idx],
            )
        )
    common = common_epochs(traces)
    if len(common) < 2:
        raise ValueError(
            f"epoch in {name}: the runs at global batches {distinct} share {len(common)} epoch number(s); "
            "the fit compares them epoch by epoch and needs at least 2 in common"
        )
    return traces


def app_spec(workload: Workload, traces: Sequence[Trace]) -> AppSpec:
    """What :func:`sim.fitting.convergence.fit_app` needs about ``workload``'s metric.

    ``acc_chance`` is the quality of the metric's ``untrained`` value (required); the targets of
    the epochs-to-target ranking are the workload's target and :data:`TARGET_STEPS` below it (in
    quality) that lie above the untrained value; the training gap is not in the traces (0).
    """
    m = workload.metric
    if m.untrained is None:
        raise ValueError(
            f"workload {workload.name}: metric.untrained (the {m.name} of an untrained model, in its "
            "units) is needed to fit the convergence model from traces"
        )
    chance = float(m.to_quality(m.untrained))
    targets = tuple(t for t in (round(workload.target_quality - d, 6) for d in TARGET_STEPS) if t > chance)
    return AppSpec(
        app=workload.convergence,
        acc_chance=chance,
        metric_scale=1.0,  # read_traces maps the metric already
        targets=targets,
        train_gap=0.0,
        chance_note=f"{m.name} of an untrained model {m.untrained:g} (workload spec)",
        train_gap_note="not in the traces; 0",
    )
