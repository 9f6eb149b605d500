"""The fidelity report (``report.md``): its sections, and the findings on where the calibrated
simulator departs from real training, each computed from the run's summary, tables and profile
when the report is rendered (nothing typed in ahead of the data)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from experiments.reports.markdown import bullets, met, percents, render, section, table
from sim.engine import HOST_BASELINE_GIB
from sim.profile import ClusterProfile

NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _count(n: int) -> str:
    return NUMBERS.get(int(n), str(n))


# --------------------------------------------------------------------------------------------
# Findings measured in this run
# --------------------------------------------------------------------------------------------


def where_wrong(
    s: dict[str, Any],
    tta: pd.DataFrame,
    intervals: pd.DataFrame,
    labels: Sequence[str],
    profile: ClusterProfile,
) -> list[str]:
    """Sentences, with figures from this run, on where the calibrated simulator departs from real."""
    out = [_tta_gap(lab, s["time_to_accuracy"][lab]) for lab in labels]
    out = [x for x in out if x]
    out += [_collapse(c) for c in s["collapses"]]
    out += _lr_spikes(profile)
    out += [x for x in (_decision_time(lab, tta) for lab in labels) if x]
    out += _interval_findings(s, intervals)
    conv = (profile.meta.get("calibration") or {}).get("convergence") or {}
    if conv:
        out.append(
            f"Convergence model: accuracy RMSE {100 * conv['rmse_raw']:.1f} points over every measured point of the "
            f"calibration curves ({100 * conv['rmse_binned']:.1f} on the seed-averaged binned curves); "
            + "; ".join(n for n in conv.get("notes", []) if n.startswith("time-to-target"))
            + "."
        )
    out += (profile.meta.get("calibration") or {}).get("notes", [])
    return out


def _tta_gap(lab: str, d: dict[str, Any]) -> str | None:
    if abs(d["ratio_sim_over_real"] - 1.0) <= 0.15:
        return None
    return (
        f"Time to accuracy, {lab}: simulated {d['sim_s']:.2f} s against {d['real_s']:.2f} s measured "
        f"(x{d['ratio_sim_over_real']:.2f}; medians {d['sim_median_s']:.2f} vs {d['real_median_s']:.2f} s). "
        f"Over the runs that reached the target the simulator takes x{d['steps_ratio_sim_over_real']:.2f} "
        f"the steps at x{d['s_per_step_ratio_sim_over_real']:.2f} the seconds per step."
    )


def _collapse(c: dict[str, Any]) -> str:
    return (
        f"Training collapse, {c['controller']} seed {c['seed']} (real): validation accuracy fell from "
        f"{c['from']:.2f} to chance ({c['to']:.2f}) at t = {c['t_s']:.1f} s, when the global batch went from "
        f"{c['batch_before']} to {c['batch_after']}, and never recovered ({c['intervals_after']} more intervals, "
        "until the time budget). The real AdaScale learning rate follows the backend's noisy noise-scale "
        "estimate and can spike after a batch jump; the simulator's follows the fitted noise scale and cannot "
        "diverge."
    )


def _lr_spikes(profile: ClusterProfile) -> list[str]:
    """Intervals of the calibration curves that lost more than 10 accuracy points."""
    curves = profile.path / "curves.csv" if profile.path is not None else None
    if curves is None or not curves.is_file():
        return []
    c = pd.read_csv(curves)
    spikes = []
    for (m, seed), g in c.groupby(["global_batch", "seed"]):
        gain = np.diff(np.concatenate([[0.0], g["progress"]])) / np.diff(np.concatenate([[0.0], g["steps"]]))
        acc = g["val_accuracy"].to_numpy()
        drop = -np.diff(acc)
        spikes += [
            (float(gain[k + 1]), int(m), int(seed), float(acc[k]), float(acc[k + 1]))
            for k in range(len(drop))
            if drop[k] > 0.1
        ]
    if not spikes:
        return []
    big = max(spikes)
    return [
        f"Learning-rate spikes in the calibration curves: {len(spikes)} intervals of the "
        f"{c.groupby(['global_batch', 'seed']).ngroups} static runs lost more than 10 accuracy points; the "
        f"largest AdaScale gain among them was x{big[0]:.1f} (global batch {big[1]}, seed {big[2]}: accuracy "
        f"{big[3]:.2f} -> {big[4]:.2f}). The simulator's accuracy never falls."
    ]


def _decision_time(lab: str, tta: pd.DataFrame) -> str | None:
    real_row = tta[(tta.controller == lab) & (tta.backend == "real")].iloc[0]
    dt = float(real_row["decision_time_ms"]) / 1e3
    per = float(real_row["tta_mean_s"]) / max(float(real_row["decisions"]) + 1.0, 1.0)
    if dt <= 0.01 * per:
        return None
    return (
        f"Decision time, {lab}: {1e3 * dt:.1f} ms per decision on the real run, {100 * dt / per:.1f} % of an "
        "interval; the real clock counts it, the simulator's does not (it charges no controller time)."
    )


def _interval_findings(s: dict[str, Any], intervals: pd.DataFrame) -> list[str]:
    if not len(intervals):
        return []
    out = []
    floor = min(s["setup"]["scenario"]["worker_speed"]) - 1e-9
    slowed = intervals.assign(throttled=[min(sp) < floor for sp in intervals["speeds"]])
    g = slowed.groupby("throttled")["ape"].median()
    if True in g.index:
        out.append(
            f"Iteration time inside the throttling window: MdAPE {100 * g[True]:.1f} % "
            f"({100 * g.get(False, math.nan):.1f} % outside it)."
        )
    worst = intervals.groupby("controller")["ape"].median().nlargest(2)
    out.append(
        f"Iteration time over the controllers' real intervals: median bias "
        f"{100 * s['iteration_time']['controller_intervals']['median_bias']:+.1f} % (predicted / measured - 1), "
        f"MdAPE {100 * intervals['ape'].median():.1f} %; largest for "
        + ", ".join(f"{c} ({100 * v:.1f} %)" for c, v in worst.items())
        + "."
    )
    return out


# --------------------------------------------------------------------------------------------
# Findings that follow from how the profile was fitted and measured
# --------------------------------------------------------------------------------------------


def construction_notes(
    profile: ClusterProfile, ladder: pd.DataFrame, gap: list[dict[str, Any]] | None, gap_path: str
) -> list[str]:
    """Where the models' construction departs from the real ranks, read from the profile (worker
    type, host floor, worker counts measured, cores) and the observation gap (``gap``: rows of
    :func:`experiments.obs_gap.read_gap`, or None when ``gap_path`` does not exist yet)."""
    prov = profile.meta.get("provenance") or {}
    real = prov.get("real_config") or {}
    additive = set((profile.meta.get("calibration") or {}).get("additive_types") or [])
    c = next(iter(profile.compute.values()))
    floor = (
        f"The {c.gpu.upper()} profile is fitted without a host floor (so that the whole fixed cost slows down, "
        "as on the real ranks); the optimiser step that the simulator does stretch is a few per cent of a step."
        if c.gpu in additive
        else f"The {c.gpu} profile's host floor is {1e3 * c.host_s:.2f} ms, which a slowed worker keeps."
    )
    n, dev = int(real.get("workers", 0)), str(real.get("device", "cpu")).upper()
    counts = sorted(int(w) for w in set(ladder["num_gpus"]) if int(w) > 1)
    slope = (
        f"; with {_count(counts[0])} workers the all-reduce model's per-extra-worker slope is not identified"
        if len(counts) == 1
        else ""
    )
    return [
        "A slowed worker: the simulator stretches `T_gpu` by `gpu_slowdown` and leaves the host floor `host_s` "
        "alone; the real adapter sleeps in proportion to the rank's forward and backward time and does not "
        f"stretch its optimiser step. {floor}",
        f"{_count(n).capitalize()} {dev} ranks share {_count(prov.get('cpu_count') or 0)} cores with the "
        "coordinator, the controller and the rank-0 validation pass: contention the one-worker compute rows do "
        f"not see is folded into the fitted all-reduce model, not modelled as such{slope}.",
        "Per-interval costs (coordination, validation on rank 0, the out-of-memory probe at a new batch) are one "
        "measured constant (`interval_overhead_s`) plus a reconfiguration delay; their spread from interval to "
        "interval is not modelled, nor is the controller's decision time.",
        "Validation accuracy in the simulator is the fitted curve plus binomial noise; real training curves "
        "differ from seed to seed by more than that (data order, initialisation), which the simulator's seeds "
        "do not reproduce. The convergence model is fitted to static-batch curves only: a schedule that moves "
        "the batch relies on its progress (AdaScale gain) and batch-memory assumptions, and its ceiling / "
        "stretch are power laws in the batch that the measured curves follow only roughly.",
        "Utilisation counters: a profile measured on CPUs counts the workers' compute as CPU time, and both "
        "backends count an emulated slow-down as busy time, so CPU and device utilisation mean the same in "
        f"both; host memory is not calibrated (the simulator assumes a {HOST_BASELINE_GIB:g} GiB process "
        "baseline, the CPU ranks use a fraction of that). `python -m experiments.obs_gap` ranks the observation "
        f"features by how much they differ between the two backends ({gap_path}): {_gap_leaders(gap)}.",
    ]


def _gap_leaders(gap: list[dict[str, Any]] | None) -> str:
    if gap is None:
        return "not measured yet"
    if not gap:
        return "no feature differs"
    parts = [
        f"{r['feature']} ({r['mean_abs_diff']:.3f}: real mean {r['real_mean']:+.3f}, simulated {r['sim_mean']:+.3f})"
        for r in gap[:2]
    ]
    return " then ".join(parts) + " lead"


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def _header(s: dict[str, Any]) -> list[str]:
    c, la = s["commands"], s["loadavg"]
    rebuilt = (
        f" (text and figures rebuilt {s['created_utc']} from the saved measurements, reanalyse=true)"
        if s["reanalysed"]
        else ""
    )
    return [
        "# Sim-to-real fidelity of the calibrated simulator",
        "",
        "Regenerate (measure and fit the profile, pretrain a policy on it, run the comparison):",
        "",
        "```bash",
        c["calibrate"],
        *([c["pretrain"]] if c.get("pretrain") else []),
        c["fidelity"],
        "```",
        "",
        f"Made {s['measured_utc'] or s['created_utc']} on {s['machine']}{rebuilt}. 1-minute load average while "
        f"measuring the episodes: median {la['median']:.2f}, max {la['max']:.2f} (start {la['start']}, end "
        f"{la['end']}; the two ranks and the coordinator themselves keep it near 1-2); {la['note']}. Calibration "
        f"measured under {la['calibration'][0]} -> {la['calibration'][1]}.",
        "",
    ]


def _setup(s: dict[str, Any], labels: Sequence[str]) -> list[str]:
    st = s["setup"]
    return section(
        "Setup",
        [
            f"- Real: {st['real']}.",
            f"- Calibrated simulator: profile `{st['profile']}` ({st['profile_summary']}).",
            f"- Scenario `{st['scenario']['name']}`: {st['scenario']['description']}; both backends play "
            "the same `sim.faults.Scenario` (the real one on its wall clock, 1 s of fault time per s).",
            f"- Controllers: {', '.join(labels)}; interval K = {st['interval']} iterations; real seeds "
            f"{st['real_seeds']}, simulated seeds {st['sim_seeds']}; static batches start at their "
            f"batch, the others at local batch {st['initial_batch']}; time budget {st['time_budget_s']:g} s.",
            f"- PPO: {s['ppo_bundle_note']}.",
            "",
        ],
    )


def _summary(s: dict[str, Any]) -> list[str]:
    tg, tm, it = s["targets"], s["targets_met"], s["iteration_time"]
    rows = [
        [
            f"iteration time, held-out ladder batches: MdAPE <= {100 * tg['iteration_time_mdape']:.0f} % per "
            "worker type",
            percents(it["mdape_by_type"]),
            met(tm["iteration_time_mdape"]),
        ],
        [
            f"Kendall's tau, real vs simulated ordering of mean time to accuracy >= {tg['kendall_tau']}",
            f"{s['ranking']['kendall_tau']:.2f}",
            met(tm["kendall_tau"]),
        ],
    ]
    if s.get("ppo"):
        rows.append(
            [
                f"PPO's advantage over the best static batch, real within {tg['ppo_gap_points']} points of simulated",
                f"gap {s['ppo']['gap_points']:.1f} points on means ({s['ppo_median']['gap_points']:.1f} on medians)",
                met(tm["ppo_gap_points"]),
            ]
        )
    lines = table(["target", "measured", ""], rows)
    bad = [c for c in s.get("collapses", []) if c["controller"] == "ppo"]
    if s.get("ppo") and not tm["ppo_gap_points"] and bad:
        lines += [
            "",
            f"The PPO target is missed on means because {len(bad)} of PPO's {len(s['setup']['real_seeds'])} real "
            "runs diverged (accuracy back to chance after the batch jumped, until the time budget), which the "
            "simulator cannot produce; on medians over seeds the gap is "
            f"{s['ppo_median']['gap_points']:.1f} points. See below.",
        ]
    return section("Summary", lines, [""])


def _iteration(s: dict[str, Any]) -> list[str]:
    it, tg, n = s["iteration_time"], s["targets"], s["setup"]["workers"]
    h, bound = it["holdout"], tg["iteration_time_mdape"]
    rows = [
        [
            f"fit on ladder batches {h['fit_batches']}, predict {h['held_out_batches']} (1 and {n} workers)",
            g,
            f"{100 * v:.1f} %",
            f"<= {100 * bound:.0f} % {met(v <= bound)}",
        ]
        for g, v in it["mdape_by_type"].items()
    ]
    rows += [
        [f"the same, {w} worker(s) only", "cpu", f"{100 * v:.1f} %", ""]
        for w, v in h["mdape_by_workers"].items()
    ]
    sp = it.get("speed_ladder")
    if sp:
        rows.append(
            [
                f"{n} ranks at speeds {sp['speeds']}, nothing fitted: iteration time",
                "cpu",
                f"{100 * sp['mdape']:.1f} %",
                "",
            ]
        )
        rows += [
            [f"the same, compute time of {w}", "cpu", f"{100 * v:.1f} %", ""]
            for w, v in sp["compute_mdape_by_worker"].items()
        ]
    ci = it["controller_intervals"]
    rows.append(
        [
            f"every real interval of every controller ({ci['n']} intervals), at its batches and fault state",
            "cpu",
            f"{100 * ci['mdape']:.1f} %",
            "",
        ]
    )
    lines = table(["check", "worker type", "MdAPE", "target"], rows)
    return section(
        "Iteration time", lines, ["", "![predicted vs measured iteration times](iteration_time.png)", ""]
    )


def _tta(s: dict[str, Any], tta: pd.DataFrame, labels: Sequence[str]) -> list[str]:
    by = tta.set_index(["controller", "backend"])
    rows = []
    for lab in labels:
        r, m, d = by.loc[(lab, "real")], by.loc[(lab, "sim")], s["time_to_accuracy"][lab]
        rows.append(
            [
                lab,
                f"{r['tta_mean_s']:.2f} +- {r['tta_sd_s']:.2f}",
                f"{m['tta_mean_s']:.2f} +- {m['tta_sd_s']:.2f}",
                f"**{d['ratio_sim_over_real']:.2f}**",
                f"{r['tta_median_s']:.2f}, {m['tta_median_s']:.2f}",
                f"{d['steps_ratio_sim_over_real']:.2f}",
                f"{d['s_per_step_ratio_sim_over_real']:.2f}",
                d["reached_real"],
                f"{r['decision_time_ms']:.1f}",
            ]
        )
    header = ["controller", "real TTA (s)", "sim TTA (s)", "sim / real", "medians real, sim (s)", "steps sim / real",
              "s per step sim / real", "reached real", "real decision time (ms)"]  # fmt: skip
    setup = s["setup"]
    metric = setup.get("metric", "accuracy")
    target = (
        f"Target validation accuracy {setup['target_accuracy']}"
        if metric.endswith("accuracy")
        else f"Target validation {metric} {setup['target_metric']:g} (as the rising quality the tables and plots "
        f"call accuracy: {setup['target_accuracy']:.4g})"
    )
    intro = [
        f"{target}. Mean over seeds (+- s.d.); a run that missed "
        "the target within the budget counts its truncation time. Steps and seconds per step: sim / real over the "
        "runs that reached the target (they split a time-to-accuracy error into convergence and speed).",
        "",
    ]
    return section("Time to accuracy and ranking", intro, table(header, rows), _ranking(s), _ppo(s))


def _ranking(s: dict[str, Any]) -> list[str]:
    rk, rm, tg = s["ranking"], s["ranking_median"], s["targets"]
    ci, cm = rk["kendall_tau_ci95"], rm["kendall_tau_ci95"]
    return [
        "",
        f"Kendall's tau between the real and simulated orderings of mean time to accuracy: **{rk['kendall_tau']:.2f}** "
        f"(p = {rk['kendall_p']:.4f}; 95 % bootstrap interval over the real runs [{ci[0]:.2f}, {ci[1]:.2f}]); "
        f"target >= {tg['kendall_tau']} {met(rk['kendall_tau'] >= tg['kendall_tau'])}. "
        f"On medians: {rm['kendall_tau']:.2f} ([{cm[0]:.2f}, {cm[1]:.2f}]).",
        "",
        f"- real order (fastest first): {' < '.join(rk['order_real'])}",
        f"- simulated order: {' < '.join(rk['order_sim'])}",
        "",
    ]


def _ppo(s: dict[str, Any]) -> list[str]:
    ppo, pm, tg = s.get("ppo"), s.get("ppo_median"), s["targets"]
    if not ppo:
        return []
    sim, real = ppo["sim"], ppo["real"]
    lines = [
        f"PPO's advantage over the best static batch (on means): simulated **{sim['advantage_pct']:+.1f} %** "
        f"(best static {sim['best_static']}), real **{real['advantage_pct']:+.1f} %** (best static "
        f"{real['best_static']}); gap **{ppo['gap_points']:.1f} points**, target <= {tg['ppo_gap_points']} "
        f"{met(ppo['gap_points'] <= tg['ppo_gap_points'])}. On medians over seeds: simulated "
        f"{pm['sim']['advantage_pct']:+.1f} %, real {pm['real']['advantage_pct']:+.1f} %, gap {pm['gap_points']:.1f} "
        "points.",
    ]
    pb = s.get("ppo_batches")
    if pb and sim["advantage_pct"] < 0 and real["advantage_pct"] < 0:
        lines += [
            "",
            f"The pretrained policy was trained on the simulator's CIFAR-10 clusters; here its mean global batch "
            f"is {pb['real']:.0f} (real) / {pb['sim']:.0f} (simulated) against a global batch of "
            f"{pb['best_static']:.0f} for the best static controller, in both backends, hence a negative advantage "
            "in both.",
        ]
    return [*lines, ""]


def report_markdown(s: dict[str, Any], tta: pd.DataFrame, labels: Sequence[str], known: Sequence[str]) -> str:
    """The whole report; ``known``: :func:`construction_notes`."""
    figures = ["![time to accuracy](tta.png)", "", "![accuracy curves](accuracy_curves.png)", ""]
    wrong = section(
        "Where the simulator is wrong",
        ["Measured in this run:", ""],
        bullets(s["where_wrong"], empty="nothing beyond the targets above"),
        ["", "Known from the models' construction:", ""],
        bullets(known),
    )
    return render(
        _header(s) + _setup(s, labels) + _summary(s) + _iteration(s) + _tta(s, tta, labels) + figures + wrong
    )
