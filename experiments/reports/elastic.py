"""The elastic apps' shared output: CSV text, the workers-and-spend plot, the host a real measurement
ran on (experiments.elastic, elastic_real, elastic_policy_real)."""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path
from typing import Any


def host_record(load_start: list[float]) -> dict[str, Any]:
    """The host a real measurement ran on: cores, the load average at its start and end, the time."""
    return {
        "cpu_count": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def csv_text(rows: list[dict[str, Any]], columns: list[str] | tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def plot_workers_spend(
    path: Path,
    timelines: list[dict[str, Any]],
    title: str = "seed 0 (held out): GPUs held and dollars spent",
    seconds_per_unit: float = 60.0,
    unit: str = "min",
    ylabel: str = "GPUs held",
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    styles = ("-", "--", ":", "-.")
    for i, name in enumerate(dict.fromkeys(t["controller"] for t in timelines)):
        rows = [t for t in timelines if t["controller"] == name]
        x = [r["wall_time_s"] / seconds_per_unit for r in rows]
        ls, lw = styles[i % len(styles)], 2.5 - 0.5 * (i % 3)
        ax1.step(x, [r["gpus"] for r in rows], where="post", label=name, linestyle=ls, linewidth=lw)
        ax2.plot(x, [r["spend_usd"] for r in rows], label=name, linestyle=ls, linewidth=lw)
    ax1.set_ylabel(ylabel)
    ax1.set_title(title)
    ax2.set_ylabel("spend ($)")
    ax2.set_xlabel(f"wall time ({unit})")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
