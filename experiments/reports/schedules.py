"""The schedule-fidelity report (:mod:`experiments.schedules`): real against simulated batch schedules.

Per learning-rate regime and schedule: time to each target (median over seeds), final accuracy (the
real runs' 95 % t-interval), the ranking of the schedules (Kendall's tau, scipy), and seconds per
step by global batch; every finding is computed here from the saved runs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from experiments.common import atomic_write_text
from sim.profile import ClusterProfile


def curve(run: dict[str, Any], interval: int) -> dict[str, np.ndarray]:
    """A run's timeline as arrays; ``samples`` counts the samples trained up to each interval's end."""
    tl = run["timeline"]
    gb = np.array([r["global_batch"] for r in tl], dtype=float)
    return {
        "t": np.array([r["wall_time_s"] for r in tl], dtype=float),
        "acc": np.array([r["val_accuracy"] for r in tl], dtype=float),
        "batch": gb,
        "step_s": np.array([r["interval_time_s"] for r in tl], dtype=float) / interval,
        "samples": np.cumsum(gb * interval),
    }


def time_to(c: dict[str, np.ndarray], target: float) -> float:
    """Wall time at the end of the first interval whose validation accuracy reaches ``target`` (nan: never)."""
    hit = np.flatnonzero(c["acc"] >= target)
    return float(c["t"][hit[0]]) if hit.size else math.nan


def rank_key(tta: float, final: float, target: float, budget_s: float) -> float:
    """Time to target for ranking: a run that missed it ranks after every run that made it, by how
    far short its final accuracy fell (budget x (1 + shortfall in points))."""
    return tta if math.isfinite(tta) else budget_s * (1.0 + 100.0 * max(0.0, target - final))


def t_interval(x: Sequence[float]) -> tuple[float, float]:
    x = np.asarray(x, dtype=float)
    if x.size < 2:
        return (float(x.mean()), float(x.mean())) if x.size else (math.nan, math.nan)
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def per_schedule(
    runs: list[dict[str, Any]], interval: int, targets: Sequence[float], window: int, budget_s: float
) -> dict[str, Any]:
    """Seed statistics of one (backend, regime, schedule) cell."""
    curves = [curve(r, interval) for r in runs]
    finals = [float(np.mean(c["acc"][-window:])) for c in curves]
    out: dict[str, Any] = {"seeds": len(runs), "final": finals, "final_mean": float(np.mean(finals))}
    out["final_ci"] = t_interval(finals)
    for tgt in targets:
        ttas = [time_to(c, tgt) for c in curves]
        keys = [rank_key(t, f, tgt, budget_s) for t, f in zip(ttas, finals, strict=True)]
        out[f"tta@{tgt}"] = ttas
        out[f"tta_median@{tgt}"] = float(np.median(keys)) if all(map(math.isfinite, ttas)) else math.nan
        out[f"rank_key@{tgt}"] = float(np.median(keys))
        out[f"reached@{tgt}"] = int(sum(map(math.isfinite, ttas)))
    steps: dict[int, list[float]] = defaultdict(list)
    for c in curves:
        for b, s in zip(c["batch"][1:], c["step_s"][1:], strict=True):  # the warm-up carries start-up costs
            steps[int(b)].append(float(s))
    out["step_s"] = {b: float(np.median(v)) for b, v in sorted(steps.items())}
    out["curves"] = curves
    return out


def analyse(runs: list[dict[str, Any]], meta: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    interval, budget = int(meta["interval"]), float(meta["budget_s"])
    targets = [float(t) for t in cfg["targets"]]
    checks = cfg["checks"]
    names = [s["name"] for s in meta["schedules"]]
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        cells[(r["backend"], r["regime"], r["schedule"])].append(r)
    result: dict[str, Any] = {"targets": targets, "regimes": {}, "schedules": names}
    for regime in meta["regimes"]:
        stats_by = {
            (b, n): per_schedule(cells[(b, regime, n)], interval, targets, int(cfg["final_window"]), budget)
            for b in ("real", "sim")
            for n in names
            if cells[(b, regime, n)]
        }
        rows = [_row(n, stats_by, targets, checks) for n in names if ("sim", n) in stats_by]
        both = [n for n in names if ("real", n) in stats_by and ("sim", n) in stats_by]
        tau = None
        if len(both) >= 3:
            k = f"rank_key@{targets[0]}"
            tau = float(stats.kendalltau([stats_by[("real", n)][k] for n in both],
                                         [stats_by[("sim", n)][k] for n in both]).statistic)  # fmt: skip
        result["regimes"][regime] = {"rows": rows, "cells": stats_by, "kendall_tau": tau,
                                     "step_times": _step_table(stats_by, both)}  # fmt: skip
    return result


def _row(name: str, cells: dict, targets: Sequence[float], checks: dict[str, Any]) -> dict[str, Any]:
    sim, real = cells[("sim", name)], cells.get(("real", name))
    row: dict[str, Any] = {"schedule": name, "sim_final": sim["final_mean"]}
    for t in targets:
        row[f"sim_tta@{t}"] = sim[f"tta_median@{t}"]
    if real is None:
        return row
    lo, hi = real["final_ci"]
    row.update(real_final=real["final_mean"], real_final_ci=(lo, hi), seeds=real["seeds"])
    gap = sim["final_mean"] - real["final_mean"]
    row["final_ok"] = bool(lo <= sim["final_mean"] <= hi or abs(gap) * 100 <= float(checks["final_points"]))
    for t in targets:
        r, s = real[f"tta_median@{t}"], sim[f"tta_median@{t}"]
        row[f"real_tta@{t}"] = r
        row[f"reached@{t}"] = f"{real[f'reached@{t}']}/{real['seeds']}, {sim[f'reached@{t}']}/{sim['seeds']}"
        row[f"tta_ratio@{t}"] = s / r if math.isfinite(r) and math.isfinite(s) else math.nan
    ratio = row[f"tta_ratio@{targets[0]}"]
    row["tta_ok"] = bool(math.isfinite(ratio) and abs(ratio - 1.0) <= float(checks["tta_rel"]))
    return row


def _step_table(cells: dict, names: Sequence[str]) -> list[dict[str, Any]]:
    """Seconds per step by global batch, real against simulated, over every schedule that ran it."""
    pooled: dict[str, dict[int, list[float]]] = {"real": defaultdict(list), "sim": defaultdict(list)}
    for (backend, name), c in cells.items():
        if name in names:
            for b, s in c["step_s"].items():
                pooled[backend][b].append(s)
    return [
        {"global_batch": b, "real_s": float(np.median(pooled["real"][b])),
         "sim_s": float(np.median(pooled["sim"][b])),
         "ratio": float(np.median(pooled["sim"][b]) / np.median(pooled["real"][b]))}
        for b in sorted(set(pooled["real"]) & set(pooled["sim"]))
    ]  # fmt: skip


# --- rendering ----------------------------------------------------------------------------------


def _f(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(str(c) for c in r) + " |" for r in rows
    ]


def regime_section(regime: str, res: dict[str, Any], targets: Sequence[float], checks: dict) -> list[str]:
    t0 = targets[0]
    lines = [f"## Learning-rate rule `{regime}`", ""]
    rows = []
    for r in res["rows"]:
        ci = r.get("real_final_ci")
        rows.append([
            r["schedule"], _f(r.get(f"real_tta@{t0}"), ".1f"), _f(r[f"sim_tta@{t0}"], ".1f"),
            _f(r.get(f"tta_ratio@{t0}")), r.get(f"reached@{t0}", "-"),
            _f(r.get("real_final"), ".3f") + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
            _f(r["sim_final"], ".3f"),
            {True: "ok", False: "**no**"}.get(r.get("tta_ok"), "-") + " / "
            + {True: "ok", False: "**no**"}.get(r.get("final_ok"), "-"),
        ])  # fmt: skip
    lines += _table(
        ["schedule", f"real s to {t0}", f"sim s to {t0}", "sim / real", "reached real, sim",
         "real final [95 %]", "sim final", "TTA / final"], rows)  # fmt: skip
    tau = res["kendall_tau"]
    verdict = "-" if tau is None else ("met" if tau >= float(checks["kendall_tau"]) else "**missed**")
    lines += ["", f"Kendall's tau of the schedules' ranking by time to {t0} (real vs simulated): "
              f"**{_f(tau)}** (target >= {checks['kendall_tau']}: {verdict})."]  # fmt: skip
    lines += _order_lines(res, t0)
    if res["step_times"]:
        lines += ["", "Seconds per step by global batch (median over intervals, warm-up excluded):", ""]
        lines += _table(["global batch", "real s", "sim s", "sim / real", f"within {checks['step_time_rel']:.0%}"],
                        [[s["global_batch"], _f(s["real_s"], ".4f"), _f(s["sim_s"], ".4f"), _f(s["ratio"]),
                          "yes" if abs(s["ratio"] - 1) <= float(checks["step_time_rel"]) else "**no**"]
                         for s in res["step_times"]])  # fmt: skip
    return [*lines, ""]


def _order_lines(res: dict[str, Any], t0: float) -> list[str]:
    cells = res["cells"]
    out = []
    for backend in ("real", "sim"):
        names = [n for (b, n) in cells if b == backend]
        if names:
            order = sorted(names, key=lambda n: cells[(backend, n)][f"rank_key@{t0}"])
            out.append(f"- {backend} order (fastest to {t0} first): " + " < ".join(order))
    return ["", *out]


def plot_regime(path: Path, regime: str, res: dict[str, Any], names: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, names, strict=False):
        for backend, style in (("real", "-"), ("sim", "--")):
            cell = res["cells"].get((backend, name))
            for i, c in enumerate(cell["curves"] if cell else []):
                ax.plot(c["samples"] / 1e3, c["acc"], style, lw=0.9, alpha=0.7,
                        color="C0" if backend == "real" else "C1", label=backend if i == 0 else None)  # fmt: skip
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("samples trained (thousands)")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("validation accuracy")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"accuracy against progress, learning-rate rule {regime}: real (solid) and simulated (dashed)"
    )
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def step_check_lines(history: list[dict[str, Any]], checks: dict[str, Any]) -> list[str]:
    """The step-time check of the last campaign that ran one (experiments.schedules.step_time_check)."""
    found = [c["step_check"] for c in history if c.get("step_check")]
    if not found:
        return []
    check = found[-1]
    rows = [[r["local_batch"], f"{1000 * r['measured_s']:.2f}", f"{1000 * r['predicted_s']:.2f}", _f(r["ratio"])]
            for r in check["rows"]]  # fmt: skip
    verdict = "within" if check["max_drift"] <= float(checks["step_time_rel"]) else "**outside**"
    return ["Step-time check before the real runs (compute per iteration, every worker at the batch):", "",
            *_table(["local batch", "measured ms", "profile ms", "profile / measured"], rows), "",
            f"Largest drift {check['max_drift']:.0%}: {verdict} {float(checks['step_time_rel']):.0%}.", ""]  # fmt: skip


def write_report(
    path: Path, result: dict[str, Any], meta: dict[str, Any], profile: ClusterProfile, checks: dict[str, Any]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    task = meta["task"]
    hist = meta.get("conditions_history") or []
    loads = [x for c in hist for x in c.get("loads", [])]
    lines = [
        "# Does a changing batch cost accuracy? Batch schedules, real and simulated",
        "",
        "Regenerate: `python -m experiments.schedules quiet.enabled=true` (resumable: one file per run under "
        f"`{meta['out_dir']}/runs`); `reanalyse=true` rebuilds this page.",
        "",
        f"- Real: {task.get('workers', 2)} CPU ranks (gloo), {task.get('model')} on {task.get('dataset')}, base lr "
        f"{task.get('base_lr')}, base batch {task.get('base_batch')}; no faults; every run trains "
        f"{meta['budget_s']:.0f} s at K = {meta['interval']} iterations per decision (no early stop).",
        f"- Simulated: profile `{meta.get('sim_profile', profile.name)}` with the same schedules, rule and budget.",
        f"- 1-minute load while measuring real runs: median {_f(float(np.median(loads)) if loads else None)}, "
        f"max {_f(max(loads) if loads else None)}.",
        "- A schedule's phase starts once validation accuracy has reached its threshold "
        "(`dynamix_gym.controllers.schedule`); a run that misses a target ranks after every run that made it.",
        "",
        *step_check_lines(hist, checks),
    ]
    for regime, res in result["regimes"].items():
        lines += regime_section(regime, res, result["targets"], checks)
        fig = path.with_name(f"{path.stem}_{regime}.png")
        plot_regime(fig, regime, res, result["schedules"])
        lines += [f"![accuracy against progress, {regime}]({fig.name})", ""]
    atomic_write_text(path, "\n".join(lines))
