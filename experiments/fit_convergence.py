"""Fit the simulator's training-progress models from the measured convergence traces.

    python -m experiments.fit_convergence [memory_fraction=0.1] [out_dir=DIR] [report_dir=DIR]

Writes ``convergence_models.json`` (default: the package's ``sim/data``) and
``convergence_fit.md`` / ``.json`` / ``.png`` (default: ``results/fit``). The work is in
:mod:`sim.fitting.convergence`; this file resolves paths, serialises, plots and writes the report.
Deterministic: a rerun on the same inputs gives the same JSON files.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

import sim
from experiments.common import atomic_write_text, describe_file
from experiments.reports.markdown import bullets, section, table
from sim.cluster import default_cluster
from sim.convergence import CONVERGENCE_MODELS_FILE, LR_RULES, ConvergenceModel
from sim.datafiles import data_path, dump_json
from sim.fitting.convergence import (
    APP_SPECS,
    TRACES_FILE,
    AppFit,
    binned_median,
    epoch_bins,
    fit_app,
    load_traces,
    log_noise_scale,
    summary,
)
from sim.fitting.tradeoff import (
    TRADEOFF_FILE,
    TradeoffFit,
    fit_tradeoff,
    load_tradeoff,
    simulate_schedule,
    static_iteration_time_s,
)
from sim.workloads import get_workload

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.fit_convergence"
EQUATION = (
    "B_noise(p) = M0 * exp(PCHIP(log_grad_var - log_grad_sqr)(p)); "
    "E = (B_noise + M0) / (B_noise + M); r_ada = (M / M0) * E; "
    "r = r_ada (adascale, linear) | min(sqrt(M / M0), r_ada) (sqrt) | "
    "min((M / M0) ** none_exponent, r_ada) (none); "
    "acc(p, m) = acc_chance + (ceiling(m) - acc_chance) * shape(p / stretch(m)), "
    "ceiling(m) = acc_ceiling - gap_per_doubling * max(0, m - log2 ref_batch), "
    "stretch(m) = 2 ** (stretch_exponent * max(0, m - log2 ref_batch)), "
    "m = EMA of log2 M over progress with time constant batch_memory_progress"
)


def model_entry(fit: AppFit | TradeoffFit, diagnostics: dict[str, Any]) -> dict[str, Any]:
    return {**asdict(fit.params), "diagnostics": diagnostics}


# --- plot ---------------------------------------------------------------------------------------
def plot(path: Path, traces: dict, fits: dict[str, AppFit], trade: TradeoffFit, t_iter: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = list(fits)
    fig, axes = plt.subplots(len(apps) + 1, 2, figsize=(12, 3.6 * (len(apps) + 1)))
    for row, app in enumerate(apps):
        fit, trs = fits[app], traces[app]
        model = ConvergenceModel(fit.params, "adascale")
        colors = plt.cm.viridis(np.linspace(0, 0.9, len(trs)))
        ax = axes[row, 0]
        for t, c in zip(trs, colors, strict=True):
            grid = np.linspace(0, t.progress[-1], 400)
            ax.plot(t.progress, t.metric, ".", ms=3, color=c, alpha=0.6)
            mem = math.log2(t.global_batch)
            ax.plot(grid, model.accuracy_many(grid, mem), "-", color=c, lw=1.2, label=f"M={t.global_batch}")
        ax.set(title=f"{app}: accuracy (dots: traces, lines: model)", xlabel="progress (M0 steps)",
               ylabel="metric (fraction)")  # fmt: skip
        lo = min(float(np.min(t.metric)) for t in trs)
        ax.set_ylim(max(lo - 0.02, 0), fit.params.acc_ceiling + 0.02)
        ax.legend(fontsize=7, ncol=2)
        ax = axes[row, 1]
        m0 = fit.params.base_batch
        for t, c in zip(trs, colors, strict=True):
            ax.plot(t.progress, np.exp(log_noise_scale(t, m0)), ".", ms=3, color=c, alpha=0.5)
        _, prog = epoch_bins(trs)
        med = np.exp(binned_median(trs, lambda t, m0=m0: log_noise_scale(t, m0)))
        ax.plot(prog, med, "ks", ms=3, label="per-epoch median")
        grid = np.linspace(fit.params.progress_knots[0], fit.params.progress_knots[-1], 400)
        ax.plot(grid, model.noise_scale_many(grid), "r-", lw=1.5, label="model B_noise")
        ax.set(yscale="log", title=f"{app}: noise scale", xlabel="progress (M0 steps)",
               ylabel="B_noise (samples)")  # fmt: skip
        ax.legend(fontsize=7)
    # ResNet-34 / CIFAR-100: static runs in minutes vs the reported peaks, and the LR rules.
    model = ConvergenceModel(trade.params, get_workload("cifar100_resnet34").lr_rule)
    ax = axes[-1, 0]
    for r, c in zip(trade.rows, plt.cm.plasma(np.linspace(0, 0.8, len(trade.rows))), strict=True):
        m = r["global_batch"]
        mem = math.log2(m)
        p_end = 1.3 * trade.params.shape_x[-1] * model.stretch(mem)
        grid = np.linspace(0, p_end, 300)
        inv = 1 / model.progress_per_step_many(m, grid)
        steps = np.concatenate([[0], np.cumsum(np.diff(grid) * 0.5 * (inv[1:] + inv[:-1]))])
        ax.plot(steps * r["iteration_time_s"] / 60, model.accuracy_many(grid, mem), color=c,
                label=f"local {r['local_batch']} (sim)")  # fmt: skip
        ax.plot(r["reported_minutes"], r["reported_accuracy"], "o", color=c, mec="k")
    dyn = trade.dynamic
    if dyn["best_switch_fraction"] is not None:
        traj: list[tuple[float, float]] = []
        rows = trade.rows
        p_need = dyn["switch_reference_progress"]
        first = next(r for r in rows if r["local_batch"] == dyn["best_first_local_batch"])
        simulate_schedule(
            model,
            [(first["global_batch"], first["iteration_time_s"], dyn["best_switch_fraction"] * p_need),
             (rows[0]["global_batch"], rows[0]["iteration_time_s"], math.inf)],
            dyn["target_accuracy"], 1e9, trajectory=traj,
        )  # fmt: skip
        tm, ta = zip(*traj, strict=True)
        ax.plot(tm, ta, "k--", lw=1.2,
                label=f"dynamic: local {first['local_batch']} then {rows[0]['local_batch']}")  # fmt: skip
    ax.set(title="ResNet-34/CIFAR-100 (no LR scaling): sim vs reported peaks (dots)",
           xlabel="minutes", ylabel="accuracy", ylim=(0.4, 0.85), xlim=(0, 300))  # fmt: skip
    ax.legend(fontsize=7)
    ax = axes[-1, 1]
    m_grid = np.geomspace(model.base_batch, 64 * model.base_batch, 100)
    for rule, ls in zip(LR_RULES, ("-", "--", "-.", ":"), strict=True):
        cm = ConvergenceModel(trade.params, rule)
        for frac, c in ((0.02, "tab:blue"), (0.5, "tab:orange")):
            p = frac * trade.params.total_progress
            ax.plot(m_grid, cm.progress_per_step_many(m_grid, p), ls, color=c,
                    label=f"{rule}, p={frac:.0%} of run")  # fmt: skip
    ax.set(xscale="log", yscale="log", title=f"{trade.params.name}: progress per step by LR rule",
           xlabel="global batch M", ylabel="r(M, p) (M0 steps per step)")  # fmt: skip
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=90, metadata={"Software": None})
    plt.close(fig)
    tmp.replace(path)


# --- report -------------------------------------------------------------------------------------
def f3(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def render_markdown(s: dict[str, Any]) -> str:
    """The human-readable report; every figure comes from ``s`` (= convergence_fit.json)."""
    intro = [
        "# Convergence model fit",
        "",
        f"Generated by `{s['command']}` from `{s['traces']['path']}` (sha256 "
        f"`{s['traces']['sha256'][:12]}`) and `{s['tradeoff']['source']['path']}`. Do not edit by "
        "hand; rerun the command. Plot: `convergence_fit.png`.",
        "",
        f"Model (`sim/convergence.py`): `{s['equation']}`.",
        "",
        *section("Choices", bullets(s["choices"])),
        "",
    ]
    apps = [line for a in s["apps"] for line in _app_section(a)]
    return "\n".join(intro + _measured(s["apps"]) + apps + _tradeoff(s["tradeoff"]))


def _measured(apps: list[dict[str, Any]]) -> list[str]:
    header = ["app", "M0", "acc_chance", "acc_ceiling", "gap / doubling", "stretch exp.", "accuracy RMSE (pts)",
              "log B_noise RMSE: bins / rows", "B_noise at epochs"]  # fmt: skip
    rows = []
    for a in apps:
        p, g = a["params"], a["grad"]
        b_at = ", ".join(f"ep {e}: {v:,.0f}" for e, v in g["noise_scale_at_epochs"].items())
        rows.append(
            [a["app"], p["base_batch"], f"{p['acc_chance']:.3g}", f"{p['acc_ceiling']:.4f}",
             f"{p['gap_per_doubling']:.5f}", f"{p['stretch_exponent']:.4f}", f"{100 * a['accuracy_rmse']['all']:.2f}",
             f"{g['rmse_log_noise_bins']:.3f} / {g['rmse_log_noise_rows']:.3f}", b_at]
        )  # fmt: skip
    note = (
        "log B_noise RMSE (natural log): *bins* = fitted curve vs the per-epoch medians over batch "
        "sizes (the smoothing error); *rows* = vs every trace row, which includes the systematic "
        "spread between batch sizes (mean trace - model per batch below: runs at larger batches "
        "measure larger noise scales at the same progress)."
    )
    return section("Measured applications", table(header, rows, align="lrrrrrrll"), ["", note, ""])


def _app_section(a: dict[str, Any]) -> list[str]:
    batches = sorted(a["accuracy_rmse"], key=lambda k: (k == "all", int(k) if k != "all" else 0))
    batches = [b for b in batches if b != "all"]
    rows = [
        ["accuracy RMSE (pts)", *(f"{100 * a['accuracy_rmse'][b]:.2f}" for b in batches)],
        ["log B_noise bias (trace - model)", *(f"{a['grad']['log_noise_bias_by_batch'][b]:+.2f}" for b in batches)],
        ["AdaScale steps to the end, model vs trace", *(f"{100 * a['adascale_steps_rel_error'][b]:+.1f} %" for b in batches)],
    ]  # fmt: skip
    ordering = [
        [f"{o['target']:.3g}", ", ".join("-" if v is None else f"{v:g}" for v in o["trace_epochs"]),
         ", ".join("-" if v is None else f"{v:.1f}" for v in o["model_epochs"]), f3(o["kendall_tau"], ".2f"),
         f3(o["spearman_rho"], ".2f")]
        for o in a["ordering"]
    ]  # fmt: skip
    epochs = [
        "",
        "Epochs to target (trace: first epoch at or above; model: crossing on the trace's own "
        "progress axis), rank agreement across batch sizes:",
        "",
    ]
    header = ["target", "trace epochs", "model epochs", "Kendall tau", "Spearman rho"]
    return section(
        a["app"],
        [f"- note: {n}" for n in a["notes"]],
        table(["global batch", *batches], rows, align="l" + "r" * len(batches)),
        epochs,
        table(header, ordering, align="rllrr"),
        [""],
        level=3,
    )


def _minutes(by_batch: dict[str, float | None]) -> str:
    return ", ".join(
        f"{k}: {'never' if v is None else f'{v:.0f} min'}"
        for k, v in sorted(by_batch.items(), key=lambda kv: int(kv[0]))
    )


def _tradeoff(t: dict[str, Any]) -> list[str]:
    p = t["params"]
    intro = [
        f"Workload `{t['workload']}` (lr_rule `{t['lr_rule']}`) on `{t['cluster']}` "
        f"({t['workers']} workers: every worker at the local batch, BSP). Iteration time from the "
        "fitted compute and communication models (`sim.hardware`, `sim.network`) of "
        f"`{t['app']}`, scaled by the workload's FLOP and gradient-size ratios. Shape and gradient "
        f"statistics borrowed from `{t['borrow']}`, stretched by progress_scale = "
        f"{t['progress_scale']:.4f}; fitted stretch_exponent = {p['stretch_exponent']:.4f}, "
        f"none_exponent = {p['none_exponent']:.4f}; acc_ceiling = {p['acc_ceiling']:.4f}, "
        f"gap_per_doubling = {p['gap_per_doubling']:.4f}, ref_batch = {p['ref_batch']:g}.",
        f"Peak = the static run's plateau ceiling(log2 M); reached at the first step within "
        f"{100 * t['peak_tolerance']:.1f} points of it.",
        "",
    ]
    header = ["local batch", "global batch", "T_iter (s)", "reported acc.", "sim acc.", "error (pts)",
              "reported min", "sim min", "error"]  # fmt: skip
    rows = [
        [r["local_batch"], r["global_batch"], f"{r['iteration_time_s']:.4f}", f"{100 * r['reported_accuracy']:.1f}",
         f"{100 * r['sim_accuracy']:.2f}", f"{r['accuracy_error_points']:+.2f}", f"{r['reported_minutes']:.0f}",
         f"{r['sim_minutes']:.1f}", f"{100 * r['minutes_rel_error']:+.1f} %"]
        for r in t["rows"]
    ]  # fmt: skip
    best = [
        f"{100 * float(target):.0f} %: local batch {b['local_batch']} ({b['minutes']:.0f} min; all: "
        f"{_minutes(b['minutes_by_local_batch'])})"
        for target, b in t["best_static"].items()
    ]
    d = t["dynamic"]
    dynamic = (
        f"Dynamic check: {d['schedule']}. Target {100 * d['target_accuracy']:.1f} % (the best static "
        f"peak, less the tolerance). Best: B1 = {d['best_first_local_batch']}, switch at f = "
        f"{f3(d['best_switch_fraction'], '.2f')}: {f3(d['dynamic_minutes'], '.1f')} min vs static "
        f"{_minutes(d['static_minutes'])}. Beats every static batch: **{'yes' if d['beats_every_static'] else 'no'}**."
    )
    return section(
        f"{p['name']}: static-batch trade-off (DYNAMIX)",
        intro,
        table(header, rows, align="r" * 9),
        ["", "Best static local batch per target (target reached = within the peak tolerance):", ""],
        bullets(best),
        ["", dynamic, ""],
    )


def fit_choices(memory_fraction: float, apps: list[str], trade: TradeoffFit) -> list[str]:
    """The modelling choices the report lists, with this fit's settings."""
    return [
        f"batch_memory_progress = {memory_fraction:g} x total_progress: the static traces cannot "
        "identify it (their memory is constant); the batch that matters for the generalisation gap "
        "is the one of the final phase (the last learning-rate stage: ImageNet's epochs 80-90 "
        "are 11 % of its run), so the memory forgets a batch over about a tenth of the run.",
        "Static-batch traces: batch memory = log2(global batch); ref_batch = the smallest batch "
        "(M0), so stretch and gap are relative to it.",
        "acc_chance per app: "
        + "; ".join(f"{a}: {APP_SPECS[a].chance_note}" for a in apps)
        + ". bert's F1 (percent) is divided by 100.",
        "train_gap per app (training accuracy above validation at the end; not in the traces): "
        + "; ".join(f"{a}: {APP_SPECS[a].train_gap_note}" for a in apps)
        + f"; {trade.params.name}: 1 - acc_ceiling (ResNet-34 interpolates CIFAR-100's training set).",
        "Gradient statistics pooled over batch sizes as per-epoch medians, GCV smoothing spline in "
        "log(progress), log B_noise made non-decreasing by isotonic regression; PCHIP knots at "
        "geometric + linear epochs plus both sides of every jump (learning-rate decays); held "
        "constant outside the knots.",
        "Accuracy: joint least squares over all batches, weighted by 1 / per-epoch RMS residual "
        "of an unweighted first pass (the traces are heteroscedastic).",
        "Ordering: Kendall's tau-b / Spearman's rho between trace and model epochs-to-target over "
        "batch sizes; NaN where either side is constant (bert reaches 0.87 and 0.88 in epoch 2 at "
        "every batch; imagenet's fitted model has no batch dependence).",
    ]


def model_entries(
    fits: dict[str, AppFit], trade: TradeoffFit, borrow: str, tradeoff_source: str, progress_scale: float
) -> list[dict[str, Any]]:
    """``convergence_models.json``'s models: every measured app's fit and the trade-off workload's."""
    models = [model_entry(f, {"accuracy_rmse_by_batch": f.rmse, "log_noise_rmse_bins":
                              f.grad.rmse_log_noise_bins, "log_noise_rmse_rows":
                              f.grad.rmse_log_noise_rows, "ordering_kendall_tau": {
                                  f"{o['target']:g}": o["kendall_tau"] for o in f.ordering},
                              "source": f"traces of {f.params.name}"})
              for f in fits.values()]  # fmt: skip
    models.append(model_entry(trade, {
        "source": f"shape and gradient statistics of {borrow} stretched by "
        f"progress_scale; fitted to {tradeoff_source}",
        "progress_scale": progress_scale,
        "tradeoff_rows": trade.rows,
    }))  # fmt: skip
    models.sort(key=lambda m: m["name"])
    return models


def fit_convergence(cfg: DictConfig) -> dict[str, Any]:
    traces_path = Path(to_absolute_path(cfg.traces)) if cfg.traces else data_path(TRACES_FILE)
    tradeoff_path = Path(to_absolute_path(cfg.tradeoff)) if cfg.tradeoff else data_path(TRADEOFF_FILE)
    out_dir = Path(to_absolute_path(cfg.out_dir)) if cfg.out_dir else Path(sim.__file__).parent / "data"
    report_dir = Path(to_absolute_path(cfg.report_dir))
    memory_fraction, peak_tol = float(cfg.memory_fraction), float(cfg.peak_tolerance)

    traces = load_traces(traces_path)
    fits = {app: fit_app(app, traces[app], memory_fraction) for app in cfg.apps}
    for app, f in fits.items():
        log.info("%s: accuracy RMSE %.4f, log B_noise RMSE %.3f (bins)", app, f.rmse["all"],
                 f.grad.rmse_log_noise_bins)  # fmt: skip

    wl = get_workload(cfg.tradeoff_workload)
    cluster = default_cluster(int(cfg.tradeoff_workers))
    points = load_tradeoff(tradeoff_path)
    t_iter = {p.local_batch: static_iteration_time_s(wl, cluster, p.local_batch) for p in points}
    trade = fit_tradeoff(
        fits[cfg.tradeoff_borrow].params, points, t_iter, cluster.num_workers, wl.num_classes,
        wl.lr_rule, memory_fraction, peak_tol, name=wl.convergence,
    )  # fmt: skip
    progress_scale = trade.params.total_progress / fits[cfg.tradeoff_borrow].params.total_progress

    app_summaries = []
    for f in fits.values():
        d = summary(f)
        d["params"] = {k: v for k, v in asdict(f.params).items() if not isinstance(v, tuple)}
        app_summaries.append(d)
    trade_summary = {
        "workload": wl.name,
        "app": wl.app,
        "lr_rule": wl.lr_rule,
        "cluster": cluster.name,
        "workers": cluster.num_workers,
        "borrow": cfg.tradeoff_borrow,
        "progress_scale": progress_scale,
        "peak_tolerance": peak_tol,
        "source": describe_file(tradeoff_path),
        "params": {k: v for k, v in asdict(trade.params).items() if not isinstance(v, tuple)},
        "rows": trade.rows,
        "best_static": trade.best_static,
        "dynamic": trade.dynamic,
    }
    choices = fit_choices(memory_fraction, list(fits), trade)
    summ = {
        "command": COMMAND,
        "traces": describe_file(traces_path),
        "equation": EQUATION,
        "choices": choices,
        "apps": app_summaries,
        "tradeoff": trade_summary,
    }
    summ = json.loads(dump_json(summ, digits=10))
    models = model_entries(fits, trade, cfg.tradeoff_borrow, trade_summary["source"]["path"], progress_scale)
    doc = {
        "generated_by": COMMAND,
        "source": {"traces": describe_file(traces_path), "tradeoff": describe_file(tradeoff_path)},
        "equation": EQUATION,
        "models": models,
    }
    # Parameters at full precision (17 digits round-trip a double): rounding log_grad_var and
    # log_grad_sqr separately would break the monotonicity of their difference on flat stretches.
    atomic_write_text(out_dir / CONVERGENCE_MODELS_FILE, dump_json(doc, digits=17))
    atomic_write_text(report_dir / "convergence_fit.json", dump_json(summ, digits=10))
    atomic_write_text(report_dir / "convergence_fit.md", render_markdown(summ))
    plot(report_dir / "convergence_fit.png", traces, fits, trade, t_iter)
    log.info("wrote %s and the report in %s", out_dir / CONVERGENCE_MODELS_FILE, report_dir)
    return summ


@hydra.main(version_base=None, config_path="../conf", config_name="fit_convergence")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the CIFAR-10 accuracy RMSE (or the first app's)."""
    s = fit_convergence(cfg)
    by_app = {a["app"]: a["accuracy_rmse"]["all"] for a in s["apps"]}
    return float(by_app.get("cifar10", next(iter(by_app.values()))))


if __name__ == "__main__":
    main()
