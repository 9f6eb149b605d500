"""Figures of an evaluation sweep (matplotlib, no pyplot state: every function builds its own Figure).

* :func:`accuracy_vs_time`: validation accuracy against wall-clock minutes, one panel per scenario,
  one line per controller (one seed);
* :func:`batch_trajectories`: every worker's local batch over time, one panel per controller,
  coloured by GPU type (one scenario, one seed);
* :func:`grouped_bars`: a per-controller x scenario metric (time to accuracy with its 95% interval,
  mean idle fraction).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

STATIC = re.compile(r"^static-(\d+)$")
GPU_COLOURS = {"T4": "tab:orange", "V100": "tab:blue", "RTX2080Ti": "tab:green", "A100": "tab:purple"}
GPU_COLOURS_FALLBACK = ("tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
DPI = 130


def controller_styles(controllers: Sequence[str]) -> dict[str, dict]:
    """Static batches in shades of grey (darker = larger, dashed); the others in distinct colours;
    the oracle in black."""
    statics = sorted((c for c in controllers if STATIC.match(c)), key=lambda c: int(STATIC.match(c).group(1)))
    others = [c for c in controllers if not STATIC.match(c) and c != "oracle"]
    styles: dict[str, dict] = {}
    for i, c in enumerate(statics):
        shade = 0.75 - 0.55 * (i / max(len(statics) - 1, 1))
        styles[c] = {"color": str(round(shade, 3)), "linestyle": "--", "linewidth": 1.2}
    palette = [
        "tab:blue",
        "tab:orange",
        "tab:green",
        "tab:red",
        "tab:purple",
        "tab:brown",
        "tab:pink",
        "tab:olive",
        "tab:cyan",
    ]
    for i, c in enumerate(others):
        styles[c] = {"color": palette[i % len(palette)], "linestyle": "-", "linewidth": 1.6}
    if "oracle" in controllers:
        styles["oracle"] = {"color": "black", "linestyle": "-", "linewidth": 2.0}
    return styles


def _grid(n: int, ncols: int = 3, panel: tuple[float, float] = (5.0, 3.6)) -> tuple[Figure, list]:
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows + 0.9), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def accuracy_vs_time(
    timelines: pd.DataFrame,
    targets: dict[str, float],
    controllers: Sequence[str],
    title: str,
    path: Path,
    y_floor: float = 0.6,
) -> Path:
    """``timelines``: rows of scenario, controller, wall_time_s, val_accuracy."""
    scenarios = list(dict.fromkeys(timelines["scenario"]))
    styles = controller_styles(controllers)
    fig, axes = _grid(len(scenarios))
    for ax, scenario in zip(axes, scenarios, strict=True):
        sub = timelines[timelines["scenario"] == scenario]
        for c in controllers:
            line = sub[sub["controller"] == c]
            if not line.empty:
                ax.plot(line["wall_time_s"] / 60.0, line["val_accuracy"], label=c, **styles[c])
        target = targets.get(scenario)
        if target is not None:
            ax.axhline(target, color="crimson", linewidth=0.8, linestyle=":", label="target")
            ax.set_ylim(max(0.0, min(y_floor, target - 0.3)), min(1.0, target + 0.03))
        ax.set_title(scenario)
        ax.set_xlabel("wall-clock time (min)")
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 7), fontsize="small")
    fig.suptitle(title)
    fig.savefig(path)
    return path


def batch_trajectories(
    timelines: dict[str, pd.DataFrame], gpu_types: Sequence[str], title: str, path: Path
) -> Path:
    """``timelines``: controller -> its timeline (wall_time_s and w{i}_batch columns)."""
    fig, axes = _grid(len(timelines), ncols=2, panel=(6.0, 3.4))
    types = list(dict.fromkeys(gpu_types))
    colour = {
        g: GPU_COLOURS.get(g, GPU_COLOURS_FALLBACK[i % len(GPU_COLOURS_FALLBACK)])
        for i, g in enumerate(types)
    }
    for ax, (controller, tl) in zip(axes, timelines.items(), strict=True):
        t = tl["wall_time_s"].to_numpy() / 60.0
        for i, g in enumerate(gpu_types):
            col = f"w{i}_batch"
            if col in tl:  # earlier types drawn wider and below, so coinciding lines show both colours
                k = types.index(g)
                width = 1.0 + 1.6 * (len(types) - 1 - k) / max(len(types) - 1, 1)
                ax.step(t, tl[col], where="post", color=colour[g], alpha=0.8, linewidth=width, zorder=2 + k)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter("{x:.0f}")
        ax.set_title(controller)
        ax.set_xlabel("wall-clock time (min)")
        ax.set_ylabel("local batch (samples)")
        ax.grid(alpha=0.3, which="both")
    handles = [
        axes[0].plot([], [], color=colour[g], label=f"{g} ({gpu_types.count(g)} workers)")[0] for g in types
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(types), fontsize="small")
    fig.suptitle(title)
    fig.savefig(path)
    return path


def grouped_bars(
    table: pd.DataFrame,
    value: str,
    ylabel: str,
    title: str,
    path: Path,
    err_low: str | None = None,
    err_high: str | None = None,
    percent: bool = False,
) -> Path:
    """One group of bars per controller, one bar per scenario; optional error bars from columns."""
    controllers = list(dict.fromkeys(table["controller"]))
    scenarios = list(dict.fromkeys(table["scenario"]))
    width = 0.8 / len(scenarios)
    x = np.arange(len(controllers))
    fig = Figure(figsize=(max(7.0, 0.75 * len(controllers) + 2.5), 4.4), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    scale = 100.0 if percent else 1.0
    for j, scenario in enumerate(scenarios):
        sub = table[table["scenario"] == scenario].set_index("controller").reindex(controllers)
        v = sub[value].to_numpy(dtype=float) * scale
        yerr = None
        if err_low and err_high:
            lo = np.nan_to_num(v - sub[err_low].to_numpy(dtype=float) * scale, nan=0.0)
            hi = np.nan_to_num(sub[err_high].to_numpy(dtype=float) * scale - v, nan=0.0)
            yerr = np.vstack([lo, hi])
        ax.bar(x + (j - (len(scenarios) - 1) / 2) * width, v, width, yerr=yerr, capsize=2, label=scenario)
    ax.set_xticks(x, controllers, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(title="scenario", fontsize="small", ncols=min(len(scenarios), 6), loc="outside lower center")
    fig.savefig(path)
    return path


def plot_sweep(
    runs: pd.DataFrame,
    table: pd.DataFrame,
    out: Path,
    seed: int | None = None,
    scenario: str | None = None,
    controllers: Sequence[str] | None = None,
) -> list[Path]:
    """The standard figures of a sweep into ``out``: ``runs`` are summary rows with ``run_dir``
    (:func:`experiments.aggregate.load_runs`), ``table`` their aggregate."""
    out.mkdir(parents=True, exist_ok=True)
    order = list(dict.fromkeys(table["controller"]))
    scenarios = list(dict.fromkeys(table["scenario"]))
    seed = int(runs["seed"].min()) if seed is None else int(seed)
    chosen = runs[runs["seed"] == seed]
    if chosen.empty:
        raise ValueError(f"plot seed {seed} is not in the sweep (seeds: {sorted(runs['seed'].unique())})")
    context = f"{runs['workload'].iloc[0]} on {runs['cluster'].iloc[0]}"
    written = []

    frames = []
    for _, r in chosen.iterrows():
        tl = pd.read_csv(Path(r["run_dir"]) / "timeline.csv", usecols=["wall_time_s", "val_accuracy"])
        frames.append(tl.assign(scenario=r["scenario"], controller=r["controller"]))
    timelines = pd.concat(frames, ignore_index=True)
    timelines = timelines.assign(_s=timelines["scenario"].map(scenarios.index)).sort_values(
        "_s", kind="stable"
    )
    targets = chosen.groupby("scenario")["target_accuracy"].first().to_dict()
    written.append(
        accuracy_vs_time(
            timelines,
            targets,
            order,
            f"Validation accuracy vs wall-clock time ({context}, seed {seed})",
            out / "accuracy_vs_time.png",
        )
    )

    scenario = scenario or scenarios[-1]
    in_scenario = chosen[chosen["scenario"] == scenario]
    if in_scenario.empty:
        raise ValueError(f"trajectory scenario {scenario!r} is not in the sweep (scenarios: {scenarios})")
    if controllers is None:  # the best static batch and the adaptive ones (random is noise)
        present = set(in_scenario["controller"])
        adaptive = [c for c in order if not STATIC.match(c) and c != "random" and c in present]
        best = table.loc[table["scenario"] == scenario, "best_static"].dropna()
        controllers = ([best.iloc[0]] if len(best) else []) + adaptive[:5]
    trajectories = {}
    for c in controllers:
        row = in_scenario[in_scenario["controller"] == c]
        if row.empty:
            raise ValueError(f"no run of controller {c!r} on {scenario!r}, seed {seed}")
        trajectories[c] = pd.read_csv(Path(row["run_dir"].iloc[0]) / "timeline.csv")
    gpu_types = str(in_scenario["gpu_types"].iloc[0]).split()
    written.append(
        batch_trajectories(
            trajectories,
            gpu_types,
            f"Per-worker local batch ({context}, scenario {scenario}, seed {seed})",
            out / "batch_trajectories.png",
        )
    )
    written.append(
        grouped_bars(
            table,
            "tta_min_mean",
            "time to accuracy (min)",
            f"Time to accuracy ({context})\nmean over the seeds reaching the target; bars: 95% t-interval",
            out / "time_to_accuracy.png",
            err_low="tta_min_ci_low",
            err_high="tta_min_ci_high",
        )
    )
    written.append(
        grouped_bars(
            table,
            "idle_fraction_mean",
            "mean idle fraction (%)",
            f"Idle time at the synchronisation barrier ({context})\nmean over workers, intervals and seeds",
            out / "idle_fraction.png",
            percent=True,
        )
    )
    return written
