"""The measured step-time table (the reference format of ``../shared/reference``): reading and
validating it and deriving per-pair compute times."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.validation import check_range

#: Columns a profile table must have (``model`` is optional, ``placement`` optional but checked).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "gpu",
    "app",
    "num_nodes",
    "num_gpus",
    "local_batch",
    "step_time_s",
    "sync_time_s",
)
NUMERIC_COLUMNS: tuple[str, ...] = (
    "num_nodes",
    "num_gpus",
    "local_batch",
    "step_time_s",
    "sync_time_s",
)

#: Fewest distinct local batches with a one-GPU row for the one-GPU step times to be the compute
#: times of a pair (3: enough for the leave-one-out check); below it the pair falls back.
MIN_ONE_GPU_BATCHES = 3
#: Where the compute times of a pair come from (see :func:`compute_source`).
SOURCE_ONE_GPU = "one-GPU step_time_s"
SOURCE_PLACEMENT_MEDIAN = "median over placements of step_time_s - sync_time_s (fallback)"

# --------------------------------------------------------------------------------------------
# Reading and validating a profile table
# --------------------------------------------------------------------------------------------


def read_profile_table(path_or_df: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Load and validate a table of measured step times in the reference format.

    The format is that of ``sim/data/reference/throughput_profiles.csv`` (see the README there):
    columns ``gpu, app, [model], [placement], num_nodes, num_gpus, local_batch, step_time_s,
    sync_time_s``. ``placement`` is read as a string of digits, one per node.

    Args:
        path_or_df: a CSV path or an already loaded DataFrame (not modified).

    Returns:
        A validated copy with integer ``num_nodes``, ``num_gpus``, ``local_batch``, float times,
        string ``gpu``, ``app`` and ``placement`` and a fresh 0-based index.

    Raises:
        ValueError: naming the column, the offending row and the allowed range, for a missing
            column, a non-numeric / NaN / infinite value, a local batch that is not an integer
            >= 1, a non-positive step time, a sync time outside [0, step_time_s], a placement
            that disagrees with num_nodes / num_gpus, or a (gpu, app) measured at one local batch.
    """
    if isinstance(path_or_df, pd.DataFrame):
        df = path_or_df.copy()
        source = "the table"
        line_offset = None
    else:
        path = Path(path_or_df)
        if not path.is_file():
            raise FileNotFoundError(f"profile table {str(path)!r} does not exist")
        df = pd.read_csv(path, dtype={"placement": str, "gpu": str, "app": str})
        source = path.name
        line_offset = 2  # header is line 1

    def where(pos: int) -> str:
        if line_offset is None:
            return f"row index {df.index[pos]!r} of {source}"
        return f"row {pos + 1} (line {pos + line_offset}) of {source}"

    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"profile table {source} lacks required column(s) {missing}; "
            f"required: {list(REQUIRED_COLUMNS)}, found: {list(map(str, df.columns))}"
        )
    if len(df) == 0:
        raise ValueError(f"profile table {source} has no rows")

    for col in ("gpu", "app"):
        bad = df[col].isna() | (df[col].astype(str).str.strip() == "")
        if bad.any():
            pos = int(np.flatnonzero(bad.to_numpy())[0])
            raise ValueError(f"{col} in {where(pos)} must be a non-empty name, got {df[col].iloc[pos]!r}")
        df[col] = df[col].astype(str).str.strip()

    for col in NUMERIC_COLUMNS:
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce").astype(np.float64)
        bad = ~np.isfinite(num.to_numpy())
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            n_bad = int(bad.sum())
            more = f" ({n_bad} rows fail this check; the first is shown)" if n_bad > 1 else ""
            raise ValueError(f"{col} in {where(pos)} must be a finite number, got {raw.iloc[pos]!r}{more}")
        df[col] = num

    def fail_first(
        col: str,
        values: np.ndarray,
        bad: np.ndarray,
        low: float,
        high: np.ndarray | None = None,
        *,
        low_open: bool = False,
        what: str = "",
    ) -> None:
        """Raise for the first row flagged in ``bad`` (check_range words the message)."""
        if not bad.any():
            return
        pos = int(np.flatnonzero(bad)[0])
        n_bad = int(bad.sum())
        more = f" ({n_bad} rows fail this check; the first is shown)" if n_bad > 1 else ""
        hi = None if high is None else float(high[pos])
        try:
            check_range(f"{col} in {where(pos)}{what}", float(values[pos]), low, hi, low_open=low_open)
        except ValueError as err:
            raise ValueError(f"{err}{more}") from None

    for col in ("local_batch", "num_nodes", "num_gpus"):
        v = df[col].to_numpy()
        not_int = v != np.round(v)
        if not_int.any():
            pos = int(np.flatnonzero(not_int)[0])
            raise ValueError(f"{col} in {where(pos)} must be an integer >= 1, got {float(v[pos])!r}")
        fail_first(col, v, v < 1, 1.0, None)
        df[col] = v.astype(np.int64)

    step = df["step_time_s"].to_numpy()
    sync = df["sync_time_s"].to_numpy()
    fail_first("step_time_s", step, step <= 0, 0.0, None, low_open=True)
    fail_first("sync_time_s", sync, sync < 0, 0.0, None)
    fail_first("sync_time_s", sync, sync > step, 0.0, step, what=" (at most step_time_s)")

    if "placement" in df.columns:
        df["placement"] = df["placement"].map(_placement_str)
        for pos, pl in enumerate(df["placement"]):
            if pl is None:
                continue
            if not pl.isdigit() or "0" in pl:
                raise ValueError(
                    f"placement in {where(pos)} must be digits 1-9, one per node "
                    f"(e.g. '44' = two nodes of 4 GPUs), got {pl!r}"
                )
            nodes, gpus = len(pl), sum(int(c) for c in pl)
            if int(df["num_nodes"].iloc[pos]) != nodes:
                raise ValueError(
                    f"num_nodes in {where(pos)} must equal the number of digits of placement "
                    f"{pl!r} ({nodes}), got {int(df['num_nodes'].iloc[pos])}"
                )
            if int(df["num_gpus"].iloc[pos]) != gpus:
                raise ValueError(
                    f"num_gpus in {where(pos)} must equal the sum of the digits of placement "
                    f"{pl!r} ({gpus}), got {int(df['num_gpus'].iloc[pos])}"
                )
    nodes_v = df["num_nodes"].to_numpy()
    gpus_v = df["num_gpus"].to_numpy()
    fail_first("num_nodes", nodes_v, nodes_v > gpus_v, 1.0, gpus_v, what=" (at most num_gpus)")
    for (gpu, app), pair in df.groupby(["gpu", "app"], sort=True):
        sizes = sorted(set(pair["local_batch"].tolist()))
        if len(sizes) < 2:
            pos = [df.index.get_loc(i) for i in pair.index]
            raise ValueError(
                f"local_batch in {where(pos[0])} and the other {len(pos) - 1} row(s) of ({gpu}, {app}) "
                f"holds a single batch size {sizes}: fitting the compute model needs 2 or more"
            )
    return df.reset_index(drop=True)


def _placement_str(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    s = str(value).strip()
    return s or None


# --------------------------------------------------------------------------------------------
# Compute times per batch, and their check against the single-GPU rows
# --------------------------------------------------------------------------------------------


def compute_times(pair: pd.DataFrame) -> pd.DataFrame:
    """Compute time per local batch of one (gpu, app), and the figures it is checked against.

    Args:
        pair: validated rows (see :func:`read_profile_table`) of one (gpu, app).

    Returns:
        One row per distinct local batch, sorted: ``local_batch``; ``single_gpu_step_s``, the
        median ``step_time_s`` of its one-GPU rows (``num_gpus == 1``; NaN where there is none);
        ``placement_median_s``, the median over all placements of ``step_time_s - sync_time_s``;
        ``n_placements``; and ``compute_time_s``, what the compute model is fitted to: the
        one-GPU step time, or, where the pair has fewer than :data:`MIN_ONE_GPU_BATCHES` one-GPU
        batches, the placement median (see :func:`compute_source`). NaN ``compute_time_s`` (a
        batch without a one-GPU row in a one-GPU pair) means the batch is not used.
    """
    d = pair.assign(placement_median_s=pair["step_time_s"] - pair["sync_time_s"])
    g = d.groupby("local_batch", sort=True)
    out = pd.DataFrame(
        {
            "placement_median_s": g["placement_median_s"].median(),
            "n_placements": g.size(),
        }
    )
    single = d[d["num_gpus"] == 1].groupby("local_batch")["step_time_s"].median()
    out["single_gpu_step_s"] = single.reindex(out.index)
    out = out.reset_index()[["local_batch", "single_gpu_step_s", "placement_median_s", "n_placements"]]
    if compute_source(out) == SOURCE_ONE_GPU:
        out["compute_time_s"] = out["single_gpu_step_s"]
    else:
        out["compute_time_s"] = out["placement_median_s"]
    return out


def compute_source(times: pd.DataFrame) -> str:
    """:data:`SOURCE_ONE_GPU` if at least :data:`MIN_ONE_GPU_BATCHES` batches of ``times``
    (a :func:`compute_times` table) have a one-GPU step time, else :data:`SOURCE_PLACEMENT_MEDIAN`."""
    n = int(times["single_gpu_step_s"].notna().sum())
    return SOURCE_ONE_GPU if n >= MIN_ONE_GPU_BATCHES else SOURCE_PLACEMENT_MEDIAN


def single_gpu_check(times: pd.DataFrame) -> dict[str, Any]:
    """How far the median over placements of step - sync is from the one-GPU step time.

    The one-GPU step time is what the compute model is fitted to; this check shows how much of
    it the multi-GPU rows book outside ``step - sync`` (a host floor counted in ``sync_time_s``).

    Args:
        times: output of :func:`compute_times`.

    Returns:
        ``median_ratio`` and ``min_ratio``/``max_ratio`` of placement median over one-GPU step
        time across the batches that have a one-GPU row, ``mdape`` (median absolute percentage
        difference, a fraction) and ``n_batches`` compared. NaNs when there is no one-GPU row.
    """
    t = times.dropna(subset=["single_gpu_step_s"])
    if t.empty:
        nan = float("nan")
        return {"median_ratio": nan, "min_ratio": nan, "max_ratio": nan, "mdape": nan, "n_batches": 0}
    ratio = (t["placement_median_s"] / t["single_gpu_step_s"]).to_numpy()
    return {
        "median_ratio": float(np.median(ratio)),
        "min_ratio": float(ratio.min()),
        "max_ratio": float(ratio.max()),
        "mdape": float(np.median(np.abs(ratio - 1.0))),
        "n_batches": len(ratio),
    }
