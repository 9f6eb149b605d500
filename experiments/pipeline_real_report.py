"""The real pipeline comparison's report: a table and the partition over time beside the stage times.

    python -m experiments.pipeline_real_report [results/pipeline/real/compare.json]

Writes ``compare.md`` (per controller the median time to the target, real and simulated, its ratio
to the even split's per seed, the machine's load) and ``partition_seed<k>.png`` (per controller:
the blocks of stage 0 over the run's wall time, and each stage's measured forward + backward
seconds per micro-batch with the emulated slow-down) beside the JSON; for another JSON name,
``<name>.md`` and ``<name>_partition_seed<k>.png``. Every figure is computed from the saved runs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from experiments.common import REPO_ROOT


def _fmt(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "not reached"


def render(path: Path) -> None:
    data = json.loads(path.read_text())
    runs = data["runs"]
    names = list(dict.fromkeys(r["controller"] for r in runs))
    lines = [
        "| controller | median time to target, real (s) | simulated (s) | per seed / even | "
        "median load (1 min) | reached |",
        "|---|---|---|---|---|---|",
    ]
    for n in names:
        mine = [r for r in runs if r["controller"] == n]
        ratios = data.get("per_seed_ratio_to_even", {}).get(n, [])
        lines.append(
            f"| {n} | {_fmt(data['median_time_to_target_s'][n])} | {_fmt(data['median_sim_time_to_target_s'][n])} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {np.median([r['load_after'][0] for r in mine]):.1f} | "
            f"{sum(r['reached_target'] for r in mine)}/{len(mine)} |"
        )
    lines += [
        "",
        f"Kendall tau, real vs simulated time to the target: over the runs {data['kendall_tau_runs']:.2f}, "
        f"over the controllers' medians {data['kendall_tau_medians']:.2f}.",
    ]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    for seed in sorted({r["seed"] for r in runs}):
        mine = [r for r in runs if r["seed"] == seed]
        fig = Figure(figsize=(10, 2.4 * len(mine)))
        axes = fig.subplots(len(mine), 2, squeeze=False)
        for (left, right), r in zip(axes, mine, strict=True):
            t = np.array([0.0] + [e["t_s"] for e in r["log"]])
            stage0 = [r["log"][0]["sizes"][0]] + [e["sizes"][0] for e in r["log"]]
            left.step(t, stage0, where="post")
            left.set_ylabel(f"{r['controller']}\nblocks of stage 0")
            left.set_ylim(0, sum(r["log"][0]["sizes"]))
            ends = [e["t_s"] for e in r["log"]]
            work = np.array([np.add(e["fwd_s"], e["bwd_s"]) for e in r["log"]]) * 1e3
            for s in range(work.shape[1]):
                right.plot(ends, work[:, s], marker=".", label=f"stage {s}")
            slow = np.array([e["slowdown"] for e in r["log"]])
            ax2 = right.twinx()
            ax2.step(ends, slow[:, 0], where="pre", color="grey", ls=":", label="slow-down of stage 0")
            ax2.set_ylabel("slow-down", fontsize=7)
            right.set_ylabel("f + b per micro-batch (ms)", fontsize=7)
            right.legend(fontsize=6, loc="upper left")
            if r["reached_target"]:
                for ax in (left, right):
                    ax.axvline(r["time_to_target_s"], color="k", lw=0.8)
        axes[-1][0].set_xlabel("wall time (s)")
        axes[-1][1].set_xlabel("wall time (s)")
        fig.suptitle(f"real stage ranks, seed {seed}: partition and stage times (target at the black line)")
        fig.tight_layout()
        prefix = (
            "" if path.stem == "compare" else f"{path.stem}_"
        )  # compare_2.json: compare_2_partition_seed0.png
        fig.savefig(path.parent / f"{prefix}partition_seed{seed}.png", dpi=100)


if __name__ == "__main__":
    render(
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else REPO_ROOT / "results" / "pipeline" / "real" / "compare.json"
    )
