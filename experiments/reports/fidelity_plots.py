"""Figures of the fidelity report: predicted vs measured iteration times, real vs simulated
accuracy curves, time to accuracy per controller with the two orderings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_iteration_times(
    path: Path,
    holdout: dict[str, Any],
    table: pd.DataFrame,
    speed: dict[str, Any] | None,
    intervals: pd.DataFrame,
    mdape: dict[str, float],
) -> None:
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(7.2, 6.4))
    if len(intervals):
        ax.scatter(
            intervals["measured_s"],
            intervals["predicted_s"],
            s=7,
            alpha=0.25,
            color="0.45",
            label=f"real controller intervals (MdAPE {100 * intervals['ape'].median():.1f} %)",
        )
    _ladder_points(ax, holdout, table)
    if speed and speed["rows"]:
        ax.scatter(
            [r["measured_s"] for r in speed["rows"]],
            [r["predicted_s"] for r in speed["rows"]],
            marker="*",
            s=110,
            color="tab:green",
            label=f"speeds {speed['speeds']}: predicted, not fitted (MdAPE {100 * speed['mdape']:.1f} %)",
        )
    pts = (
        [r["measured_s"] for r in holdout["rows"]]
        + list(table["step_time_s"])
        + list(intervals.get("measured_s", []))
    )
    lo, hi = 0.7 * min(pts), 1.4 * max(pts)
    x = np.geomspace(lo, hi, 50)
    ax.plot(x, x, "k-", lw=1)
    ax.plot(x, 1.1 * x, "k:", lw=0.8, label="+-10 %")
    ax.plot(x, x / 1.1, "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (s), real DDP ranks")
    ax.set_ylabel("predicted iteration time (s), calibrated simulator")
    ax.set_title(
        "Iteration time: held-out MdAPE " + ", ".join(f"{g} {100 * v:.1f} %" for g, v in mdape.items())
    )
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _ladder_points(ax: Any, holdout: dict[str, Any], table: pd.DataFrame) -> None:
    """The ladder's fitted batches (hollow) and held-out batches (red) per worker count."""
    from sim.fitting.step_time import step_time_s

    held = {(r["workers"], r["local_batch"]) for r in holdout["rows"]}
    fitted = holdout["fit"]
    markers = {1: "o", 2: "s", 3: "^", 4: "D"}
    for w, g in table.groupby("num_gpus"):
        fit_rows = g[[(w, b) not in held for b in g["local_batch"]]]
        gpu = str(g["gpu"].iloc[0])
        c = next(p for p in fitted["compute"] if p.gpu == gpu)
        m = next((p for p in fitted["comm"] if p.gpu == gpu), None)
        pred = step_time_s(c, m, fit_rows["local_batch"].to_numpy(np.float64), int(w))
        ax.scatter(
            fit_rows["step_time_s"],
            pred,
            marker=markers.get(int(w), "o"),
            facecolors="none",
            edgecolors="tab:blue",
            s=36,
            label=f"{w} worker(s): ladder batches fitted",
        )
        hr = [r for r in holdout["rows"] if r["workers"] == w]
        ax.scatter(
            [r["measured_s"] for r in hr],
            [r["predicted_s"] for r in hr],
            marker=markers.get(int(w), "o"),
            color="tab:red",
            s=40,
            label=f"{w} worker(s): held-out batches",
        )


def plot_accuracy(
    path: Path, timelines: pd.DataFrame, labels: Sequence[str], target: float, sim_show: int
) -> None:
    plt = _pyplot()

    cols = 4
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.5 * cols, 2.9 * rows), sharey=True, squeeze=False)
    for ax, label in zip(axes.flat, labels, strict=False):
        t = timelines[timelines.controller == label]
        sims = [g for i, (_, g) in enumerate(t[t.backend == "sim"].groupby("seed")) if i < sim_show]
        reals = [g for _, g in t[t.backend == "real"].groupby("seed")]
        for i, g in enumerate(sims):
            _accuracy_line(ax, g, "tab:blue", 1.0, 0.7, "simulated" if i == 0 else None)
        ends = [float(g["wall_time_s"].iloc[-1]) for g in sims]
        cut = 0
        for i, g in enumerate(reals):
            reached = bool(g["val_accuracy"].iloc[-1] >= target)
            _accuracy_line(ax, g, "tab:red", 1.2, 0.8, "real" if i == 0 else None)
            if reached:
                ends.append(float(g["wall_time_s"].iloc[-1]))
            else:
                cut += 1
        ax.axhline(target, color="k", lw=0.7, ls=":")
        ax.set_xlim(0, 1.15 * max(ends) if ends else None)
        ax.set_title(label + (f" ({cut} real run missed the target; cut)" if cut else ""), fontsize=8)
        ax.grid(True, alpha=0.2)
    for ax in axes.flat[len(labels) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("validation accuracy")
    for ax in axes[-1, :]:
        ax.set_xlabel("wall time (s)")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Validation accuracy over time: real (red, every seed) vs calibrated simulator (blue, {sim_show} seeds); "
        f"dotted: target {target}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _accuracy_line(ax: Any, g: pd.DataFrame, color: str, lw: float, alpha: float, label: str | None) -> None:
    ax.plot(g["wall_time_s"], g["val_accuracy"], color=color, lw=lw, alpha=alpha, label=label)


def plot_tta(
    path: Path, table: pd.DataFrame, runs: pd.DataFrame, labels: Sequence[str], rank: dict[str, Any]
) -> None:
    plt = _pyplot()
    real = table[table.backend == "real"].set_index("controller").loc[list(labels)]
    simt = table[table.backend == "sim"].set_index("controller").loc[list(labels)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12.5, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    _tta_bars(a1, real, simt, runs, labels)
    _tta_scatter(a2, real, simt, labels, rank)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _tta_bars(
    a1: Any, real: pd.DataFrame, simt: pd.DataFrame, runs: pd.DataFrame, labels: Sequence[str]
) -> None:
    """Mean time to accuracy per controller and backend, every run a dot, the ratio above."""
    from matplotlib.ticker import ScalarFormatter

    x = np.arange(len(labels))
    a1.bar(x - 0.2, real["tta_mean_s"], 0.4, color="tab:red", alpha=0.55, label="real (mean; dots: runs)")
    a1.bar(
        x + 0.2, simt["tta_mean_s"], 0.4, color="tab:blue", alpha=0.55, label="simulated (mean; dots: runs)"
    )
    for i, lab in enumerate(labels):
        for backend, dx, color in (("real", -0.2, "tab:red"), ("sim", 0.2, "tab:blue")):
            _run_dots(a1, runs[(runs.controller == lab) & (runs.backend == backend)], i + dx, color)
        ratio = float(simt.loc[lab, "tta_mean_s"] / real.loc[lab, "tta_mean_s"])
        a1.annotate(
            f"x{ratio:.2f}",
            (i, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    a1.set_yscale("log")
    a1.yaxis.set_major_formatter(ScalarFormatter())
    a1.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    a1.set_ylabel("time to accuracy (s)")
    a1.set_title("Time to accuracy per controller; above the bars: mean sim / mean real", fontsize=9, pad=18)
    a1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.9))


def _run_dots(ax: Any, g: pd.DataFrame, x: float, color: str) -> None:
    t = np.where(g["reached"], g["tta_s"], g["total_time_s"])
    ax.scatter(np.full(len(t), x), t, s=10, color=color, zorder=3, marker="o", edgecolors="k", linewidths=0.3)
    missed = int((~g["reached"].astype(bool)).sum())
    if missed:
        ax.annotate(
            f"{missed} missed",
            (x, float(np.max(t))),
            fontsize=7,
            ha="center",
            xytext=(0, 4),
            textcoords="offset points",
        )


def _tta_scatter(
    a2: Any, real: pd.DataFrame, simt: pd.DataFrame, labels: Sequence[str], rank: dict[str, Any]
) -> None:
    """Simulated against real mean time to accuracy, log-log, with Kendall's tau in the title."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    a2.scatter(real["tta_mean_s"], simt["tta_mean_s"], color="k", zorder=3)
    for lab in labels:
        a2.annotate(
            lab,
            (real.loc[lab, "tta_mean_s"], simt.loc[lab, "tta_mean_s"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    both = np.concatenate([real["tta_mean_s"], simt["tta_mean_s"]])
    lim = [0.8 * both.min(), 1.25 * both.max()]
    a2.plot(lim, lim, "k-", lw=0.8)
    a2.fill_between(lim, [v / 1.15 for v in lim], [v * 1.15 for v in lim], color="0.9", label="+-15 %")
    a2.set_xscale("log")
    a2.set_yscale("log")
    for axis in (a2.xaxis, a2.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    a2.set_xlim(lim)
    a2.set_ylim(lim)
    a2.set_xlabel("real, mean over seeds (s)")
    a2.set_ylabel("simulated, mean over seeds (s)")
    ci = rank["kendall_tau_ci95"]
    a2.set_title(
        f"Kendall tau {rank['kendall_tau']:.2f} (95 % bootstrap [{ci[0]:.2f}, {ci[1]:.2f}])", fontsize=9
    )
    a2.legend(fontsize=7, loc="upper left")
    a2.grid(True, which="both", alpha=0.2)
