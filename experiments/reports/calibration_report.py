"""The calibration report (``calibration.md`` beside a profile): the fitted compute and all-reduce
models, the held-out step times, the convergence fit (from measured curves or from traces) and the
fit figures, rendered from the profile and its calibration record."""

from __future__ import annotations

import math
from typing import Any

from experiments.calibration.fit import COMMAND, fit_figures
from experiments.reports.markdown import blocks, bullets, percents, render, section, table
from sim.fitting.step_time import ADDITIVE_RULE
from sim.profile import ClusterProfile


def report_markdown(profile: ClusterProfile, fit: dict[str, Any], notes: list[str]) -> str:
    """``calibration.md``; ``fit``: at least the held-out check (``fit["holdout"]``)."""
    cal = profile.meta.get("calibration") or {}
    traces = cal.get("convergence_traces")
    parts = [
        _header(profile),
        _compute(profile, cal),
        _comm(profile),
        _holdout(fit["holdout"]),
        _curves(cal.get("convergence")),
        _traces(traces),
        _figures(fit_figures(profile, traces)),
        section("Notes", bullets(notes)) if notes else [],
    ]
    return render(blocks(parts))


def _header(profile: ClusterProfile) -> list[str]:
    prov = profile.meta.get("provenance", {})
    load = (
        f"; load average {prov['loadavg_start']} -> {prov['loadavg_end']}" if "loadavg_start" in prov else ""
    )
    wl = profile.workload
    return [
        f"# Cluster profile `{profile.name}`",
        "",
        f"Regenerate: `{prov.get('command', COMMAND)}`",
        "",
        f"Mode: {prov.get('mode')}; created {prov.get('created_utc')}{load}",
        "",
        f"Cluster: {', '.join(f'{n.gpus} x {n.gpu}' for n in profile.cluster.nodes)}; workload "
        f"`{wl.name}` (app `{wl.app}`, convergence `{wl.convergence}`).",
        f"Simulator settings: {dict(profile.simulator) or 'defaults'}.",
    ]


def _compute(profile: ClusterProfile, cal: dict[str, Any]) -> list[str]:
    rows = [
        [g, a, f"{p.alpha_s:.4g}", f"{p.beta_s:.4g}", f"{p.exponent:.3g}", f"{p.host_s:.4g}", f"{p.k:.3g}",
         p.max_batch, f"{100 * p.loo_mdape:.1f}"]
        for (g, a), p in sorted(profile.compute.items())
    ]  # fmt: skip
    header = ["worker", "app", "alpha_s", "beta_s", "exponent", "host_s", "k", "max batch", "LOO MdAPE %"]
    additive = cal.get("additive_types") or []
    rule = ["", f"Fitted without a host floor: {', '.join(additive)} ({ADDITIVE_RULE})."] if additive else []
    title = "Compute models (T_compute(b) = smooth_max(host_s, alpha_s + beta_s b^exponent, k))"
    return section(title, table(header, rows), rule)


def _comm(profile: ClusterProfile) -> list[str]:
    rows = [
        [g, a, f"{p.alpha_intra_s:.4g}", f"{p.beta_intra_s:.4g}", f"{p.gamma:.3g}", f"{100 * p.fit_mape:.1f}"]
        for (g, a), p in sorted(profile.comm.items())
    ]
    header = ["worker", "app", "alpha_intra_s", "beta_intra_s", "gamma", "fit MAPE %"]
    return section("All-reduce models", table(header, rows))


def _holdout(h: dict[str, Any]) -> list[str]:
    text = (
        f"Fit batches {h['fit_batches']}, held out {h['held_out_batches']}. MdAPE per worker type: "
        f"{percents(h['mdape'])}."
        if h.get("rows")
        else f"Not computed: {h.get('error', 'no rows')}."
    )
    return section("Held-out step times (fit on part of the batch ladder, predict the rest)", [text])


def _curves(conv: dict[str, Any] | None) -> list[str]:
    if not conv:
        return []
    by_batch = ", ".join(f"{b}: {100 * v:.2f}" for b, v in conv["rmse_by_global_batch"].items())
    steps = [
        f"global batch {s['global_batch']} (seed {s['seed']}): steps to {s['target']:.3f} measured "
        f"{_steps(s['measured_steps'])}, model {_steps(s['model_steps'])}"
        for s in conv["steps_to_target"]
    ]
    text = (
        f"Accuracy RMSE {100 * conv['rmse_raw']:.2f} points over every measured point "
        f"({100 * conv['rmse_binned']:.2f} on the binned curves); by global batch: {by_batch}."
    )
    stats = conv.get("grad_stats")
    if stats is not None:
        text += (
            " Gradient statistics fitted to each interval's own two-batch estimates (`curves.grad_stats=raw`)."
            if stats == "raw"
            else " Gradient statistics fitted to the real estimator's moving average (`curves.grad_stats=ema`)."
        )
    return section(
        "Convergence model from measured curves", [text], bullets(conv.get("notes", [])), bullets(steps)
    )


def _steps(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f}"


def _traces(traces: dict[str, Any] | None) -> list[str]:
    if not traces:
        return []
    m = traces["metric"]
    unit = f"{m['name']} (higher is {'better' if m['higher_is_better'] else 'worse'}, scale {m['scale']:g})"
    by_batch = ", ".join(
        f"{b}: {v / m['scale']:.4g}" for b, v in sorted(traces["accuracy_rmse_by_batch"].items(), key=_batch)
    )
    text = [
        f"Metric {unit}; untrained {m['untrained']}; traces at global batches {traces['batches']} "
        f"({traces['source']['path']}).",
        f"Accuracy RMSE {traces['accuracy_rmse_metric']:.4g} {m['name']} "
        f"({traces['accuracy_rmse']:.4g} as a quality fraction); by global batch: {by_batch}.",
        "",
    ]
    header = [f"target {m['name']}", "batches", "trace epochs", "model epochs", "Kendall tau", "Spearman rho"]
    rows = [
        [f"{o['target_metric']:.4g}", o["batches"], o["trace_epochs"], o["model_epochs"], _fmt(o["kendall_tau"]),
         _fmt(o["spearman_rho"])]
        for o in traces["ordering"]
    ]  # fmt: skip
    return section(
        "Convergence model from traces", text, table(header, rows), bullets(traces.get("notes", []))
    )


def _figures(figures: dict[str, Any]) -> list[str]:
    lines = [
        f"Step-time leave-one-batch-out MdAPE per worker type: {percents(figures['step_time_loo_mdape'])}."
    ]
    if "accuracy_rmse" in figures:
        taus = ", ".join(f"{t}: {_fmt(v)}" for t, v in figures["epochs_to_target_kendall_tau"].items())
        lines.append(
            f"Accuracy RMSE {figures['accuracy_rmse_metric']:.4g} {figures['metric']}; epochs-to-target "
            f"Kendall tau: {taus}."
        )
    return section("Fit figures", lines)


def _batch(item: tuple[str, float]) -> int:
    return int(item[0])


def _fmt(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.2f}"
