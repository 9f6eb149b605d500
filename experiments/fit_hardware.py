"""Fit the simulator's compute and communication models from measured step times.

    python -m experiments.fit_hardware [table=TABLE.csv] [out_dir=DIR] [report_dir=DIR]
        [host_floor_pairs=[V100/cifar10,V100/ncf]]

Writes ``compute_models.json`` and ``comm_models.json`` (default: the package's ``sim/data``) and
``hardware_fit.md`` / ``hardware_fit.json`` (default: ``results/fit``). The work is in
:mod:`sim.fitting.hardware`; this file only resolves paths, serialises and writes the report. Output is
deterministic: a rerun on the same table gives byte-identical files.
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
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

import sim
from experiments.calibration.fit import parse_pairs
from experiments.common import atomic_write_text, describe_file
from experiments.reports.markdown import blocks, bullets, render, section, table
from sim.datafiles import data_path, dump_json
from sim.fitting.hardware import (
    COMM_EQUATION,
    COMPUTE_EQUATION,
    EXPONENT_RULE,
    HOST_FLOOR_PAIRS,
    HOST_FLOOR_RULE,
    MIN_ONE_GPU_BATCHES,
    SOURCE_PLACEMENT_MEDIAN,
    fit_all,
)
from sim.fitting.table import read_profile_table
from sim.hardware import COMPUTE_MODELS_FILE, ComputeParams
from sim.network import COMM_MODELS_FILE, CommParams

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.fit_hardware"
REPORT_MD = "hardware_fit.md"
REPORT_JSON = "hardware_fit.json"
#: A pair is flagged in the report when its median over placements of step - sync differs from
#: its one-GPU step time by more than SINGLE_GPU_FLAG (median over batches) or by more than
#: SINGLE_GPU_FLAG_ANY at any one batch.
SINGLE_GPU_FLAG = 0.10
SINGLE_GPU_FLAG_ANY = 0.20
#: Data caveats: a one-GPU step time that falls by more than this as the batch grows is listed.
NON_MONOTONIC_DROP = 0.05
#: Data caveats: a multi-GPU placement whose step time changes by more than this factor between
#: two consecutive batches is counted as jumping.
JUMP_FACTOR = 1.2
#: Data caveats named in the report when the table has them (computed from the table, see
#: :func:`data_caveats`): a regime change between two consecutive batches of the multi-GPU rows.
KNOWN_JUMPS: tuple[tuple[str, str, int, int], ...] = (("V100", "ncf", 2901, 4103),)
#: The written files' floats: 6 significant digits, |x| < 1e-12 written as 0.
JSON_ROUNDING: dict[str, Any] = {"digits": 6, "zero_below": 1e-12}


def single_gpu_flagged(check: dict[str, Any]) -> bool:
    if check["n_batches"] == 0:
        return False
    worst = max(abs(check["min_ratio"] - 1.0), abs(check["max_ratio"] - 1.0))
    return abs(check["median_ratio"] - 1.0) > SINGLE_GPU_FLAG or worst > SINGLE_GPU_FLAG_ANY


def per_batch(errors: dict[int, float]) -> list[list[float]]:
    return [[int(b), float(e)] for b, e in sorted(errors.items())]


def compute_entry(p: ComputeParams, diag: dict[str, Any]) -> dict[str, Any]:
    entry = {k: v for k, v in asdict(p).items()}
    entry.update(
        compute_source=diag["compute_source"],
        compute_fallback=diag["compute_fallback"],
        alpha_held_zero=diag["alpha_held_zero"],
        n_batches=diag["n_batches"],
        n_batches_measured=diag["n_batches_measured"],
        n_rows=diag["n_rows"],
        n_placements=diag["n_placements"],
        min_measured_batch=diag["min_measured_batch"],
        exponent_mode=diag["exponent_mode"],
        loo_mdape_fixed_exponent=diag["loo_mdape_fixed"],
        loo_mdape_free_exponent=diag["loo_mdape_free"],
        loo_per_batch=per_batch(diag["loo_per_batch"]),
        residual_per_batch=per_batch(diag["residual_per_batch"]),
        single_gpu_check=diag["single_gpu_check"],
        single_gpu_step_mape=diag["single_gpu_step_mape"],
    )
    return entry


def comm_entry(p: CommParams, diag: dict[str, Any]) -> dict[str, Any]:
    entry = {k: v for k, v in asdict(p).items()}
    c = diag["comm"]
    entry.update(
        n_rows=c["n_rows"],
        n_rows_intra=c["n_rows_intra"],
        n_rows_inter=c["n_rows_inter"],
        fit_mdape=c["fit_mdape"],
        exposed_mape=c["exposed_mape"],
        exposed_mdape=c["exposed_mdape"],
        exposed_mae_s=c["exposed_mae_s"],
        notes=list(c["notes"]),
    )
    return entry


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}"


def _one_gpu(table: pd.DataFrame, gpu: str, app: str) -> pd.Series:
    """Median one-GPU step time per local batch of (gpu, app) (empty if none)."""
    one = table[(table["gpu"] == gpu) & (table["app"] == app) & (table["num_gpus"] == 1)]
    return one.groupby("local_batch")["step_time_s"].median().sort_index()


def data_caveats(
    table: pd.DataFrame, pairs: list[dict[str, Any]], host_floor_pairs: list[tuple[str, str]]
) -> list[str]:
    """Caveats of the measured table that bear on the fit, each a sentence with figures from it."""
    by_pair = {(r["gpu"], r["app"]): r for r in pairs}
    return (
        _host_floor_caveats(table, by_pair, host_floor_pairs)
        + _jump_caveats(table)
        + _inter_node_caveats(table, pairs)
        + _copied_caveats(pairs)
        + _non_monotonic_caveats(table, pairs)
    )


def _host_floor_caveats(
    table: pd.DataFrame,
    by_pair: dict[tuple[str, str], dict[str, Any]],
    host_floor_pairs: list[tuple[str, str]],
) -> list[str]:
    """A per-step host floor, and where the multi-GPU rows book it."""
    out: list[str] = []
    for gpu, app in host_floor_pairs:
        r = by_pair.get((gpu, app))
        one = _one_gpu(table, gpu, app)
        if r is None or one.empty:
            continue
        b0 = int(one.index[0])
        others = []
        for other in sorted(set(table["gpu"]) - {gpu}):
            o = _one_gpu(table, other, app)
            if b0 in o.index:
                others.append(f"{other} {o.loc[b0]:.4f} s")
        slower = _slower_than_t4(table, gpu, app, one)
        sc, c, m = r["single_gpu_check"], r["compute"], r.get("comm") or {}
        held = " (alpha_s held at 0)" if r["alpha_held_zero"] else ""
        comm = (
            f"; the comm model fitted with it held fixed has alpha_intra_s {m['alpha_intra_s']:.3g} s"
            if m
            else ""
        )
        out.append(
            f"Host floor, {gpu}/{app}: one-GPU step {one.iloc[0]:.4f} s at local batch {b0}"
            + (f" ({', '.join(others)})" if others else "")
            + f", {one.iloc[len(one) // 2]:.4f} s at {int(one.index[len(one) // 2])}{slower}. In the "
            f"multi-GPU rows step - sync is down to {sc['min_ratio']:.2f} x the one-GPU step "
            f"(median {sc['median_ratio']:.2f}): the floor is counted in sync_time_s there, so it is "
            f"fitted from the one-GPU rows as host_s = {c['host_s']:.4f} s{held}{comm}."
        )
    return out


def _slower_than_t4(table: pd.DataFrame, gpu: str, app: str, one: pd.Series) -> str:
    if "T4" not in set(table["gpu"]) or gpu == "T4":
        return ""
    t4 = _one_gpu(table, "T4", app)
    common = one.index.intersection(t4.index)
    slow = [int(b) for b in common if one.loc[b] > t4.loc[b]]
    if not len(common) or not slow:
        return ""
    return f"; slower than T4 at {len(slow)} of {len(common)} common batches ({min(slow)} to {max(slow)})"


def _jump_caveats(table: pd.DataFrame) -> list[str]:
    """Regime changes between two batches seen in the multi-GPU rows only."""
    out: list[str] = []
    for gpu, app, b1, b2 in KNOWN_JUMPS:
        p = table[(table["gpu"] == gpu) & (table["app"] == app)]
        if p.empty or "placement" not in p:
            continue
        piv = p.pivot_table(index="local_batch", columns="placement", values="step_time_s")
        if b1 not in piv.index or b2 not in piv.index:
            continue
        multi = [pl for pl in piv.columns if sum(int(ch) for ch in pl) > 1]
        ratio = (piv.loc[b2, multi] / piv.loc[b1, multi]).dropna()
        one = _one_gpu(table, gpu, app)
        up, down = ratio[ratio > JUMP_FACTOR], ratio[ratio < 1.0 / JUMP_FACTOR]
        if ratio.empty or b1 not in one.index or b2 not in one.index:
            continue

        picks = ([str(up.idxmax())] if len(up) else []) + ([str(down.idxmin())] if len(down) else [])
        examples = ", ".join(f"{pl}: {piv.loc[b1, pl]:.3f} -> {piv.loc[b2, pl]:.3f} s" for pl in picks)
        out.append(
            f"Jump, {gpu}/{app} between local batch {b1} and {b2}: the one-GPU step changes by "
            f"x{one.loc[b2] / one.loc[b1]:.3f}, the multi-GPU steps by x{float(np.median(ratio)):.3f} "
            f"(median of {len(ratio)} placements); {len(up)} rise and {len(down)} fall by more than "
            f"x{JUMP_FACTOR:g}" + (f" ({examples})" if examples else "") + ". The compute model, fitted "
            "to the one-GPU steps, does not see it; the comm model averages over it."
        )
    return out


def _inter_node_caveats(table: pd.DataFrame, pairs: list[dict[str, Any]]) -> list[str]:
    """Inter-node start-up cost larger than a whole one-GPU step."""
    out: list[str] = []
    for r in pairs:
        m = r.get("comm")
        one = _one_gpu(table, r["gpu"], r["app"])
        if not m or one.empty or m["alpha_inter_s"] <= one.max() or r["comm_notes"]:
            continue
        p = table[(table["gpu"] == r["gpu"]) & (table["app"] == r["app"])]
        b0 = int(one.index[0])
        at_b0 = p[p["local_batch"] == b0]
        intra = at_b0[(at_b0["num_nodes"] == 1) & (at_b0["num_gpus"] > 1)]["step_time_s"]
        inter = at_b0[at_b0["num_nodes"] > 1]["step_time_s"]
        measured = (
            f"; measured at local batch {b0}: one GPU {one.iloc[0]:.3f} s, one node (median) "
            f"{intra.median():.3f} s, several nodes (median) {inter.median():.3f} s"
            if len(intra) and len(inter)
            else ""
        )
        out.append(
            f"Inter-node cost, {r['gpu']}/{r['app']}: fitted alpha_inter_s = {m['alpha_inter_s']:.3f} s "
            f"(alpha_intra_s {m['alpha_intra_s']:.3f} s), more than the slowest one-GPU step "
            f"({one.max():.3f} s){measured}: the measured multi-node steps are that slow, it is not "
            "a fit artefact."
        )
    return out


def _copied_caveats(pairs: list[dict[str, Any]]) -> list[str]:
    """Parameters copied for lack of rows."""
    out: list[str] = []
    for r in pairs:
        for note in r["comm_notes"]:
            out.append(f"Copied parameters, {r['gpu']}/{r['app']}: {note} (the data has no such rows).")
    return out


def _non_monotonic_caveats(table: pd.DataFrame, pairs: list[dict[str, Any]]) -> list[str]:
    """One-GPU step times that fall as the batch grows."""
    out: list[str] = []
    for r in pairs:
        one = _one_gpu(table, r["gpu"], r["app"])
        drops = [
            f"{int(b1)} -> {int(b2)}: {one.loc[b1]:.4g} -> {one.loc[b2]:.4g} s"
            for b1, b2 in zip(one.index[:-1], one.index[1:], strict=True)
            if one.loc[b2] < (1.0 - NON_MONOTONIC_DROP) * one.loc[b1]
        ]
        if drops:
            out.append(
                f"Non-monotonic, {r['gpu']}/{r['app']}: the one-GPU step time falls by more than "
                f"{pct(NON_MONOTONIC_DROP, 0)} % as the batch grows ({'; '.join(drops)}); the "
                "compute model, monotone in the batch, cannot follow these drops."
            )
    return out


def render_markdown(summary: dict[str, Any]) -> str:
    """``hardware_fit.md`` from the summary (``hardware_fit.json``'s content)."""
    pairs = summary["pairs"]
    return render(
        blocks(
            [
                _intro(summary),
                section("Fit quality", _quality_table(pairs), ["", _fallback_line(pairs)]),
                section("Fitted parameters", _parameter_table(pairs)),
                section("Check: median over placements of step - sync vs one-GPU step time", *_check(pairs)),
                section("Data caveats", bullets(summary["data_caveats"])),
            ]
        )
    )


def _intro(summary: dict[str, Any]) -> list[str]:
    floor_pairs = ", ".join(f"{g}/{a}" for g, a in summary["host_floor_pairs"]) or "none"
    return [
        "# Hardware model fit",
        "",
        f"Generated by `{summary['command']}` from `{summary['source']['path']}` "
        f"(sha256 `{summary['source']['sha256'][:12]}`). Do not edit by hand; rerun the command.",
        "",
        f"- Compute: `{summary['compute_equation']}`.",
        "  Fitted with `scipy.optimize.least_squares` on log residuals, soft_l1 loss, bounded "
        f"parameters, fixed initial guesses; {summary['exponent_rule']}; {summary['host_floor_rule']}"
        f" ({floor_pairs}).",
        "  The target is the one-GPU `step_time_s` as measured (its 0.3-14 ms `sync_time_s` is not "
        "subtracted): a one-replica job has no all-reduce in the simulator, so its iteration time "
        "is `T_compute`. A pair with fewer than "
        f"{summary['min_one_gpu_batches']} one-GPU batch sizes falls back to the median over "
        "placements of `step_time_s - sync_time_s` and is flagged.",
        f"- Communication: `{summary['comm_equation']}`; the pair's compute model held fixed.",
        "- LOO MdAPE: leave-one-batch-size-out median absolute percentage error of the fitted step "
        "time of a one-GPU job (fit on all other batch sizes, predict the held-out one). The "
        "exponent mode was chosen by this same figure, so it is slightly optimistic where the free "
        "exponent won.",
        "- In-sample MAPE: compute model vs the compute times it was fitted to. 1-GPU step MAPE: vs "
        "every one-GPU row (the same figure unless a pair fell back). Comm MAPE: predicted vs "
        "measured step time over all multi-GPU rows. Exposed MdAPE: predicted exposed comm "
        "(step - T_compute) vs measured `sync_time_s`, median over the same rows; it is large where "
        "the multi-GPU rows count in `sync_time_s` time that the one-GPU step also contains (see "
        "the check below), and where the comm is mostly hidden.",
        "",
        f"Target: LOO MdAPE <= {pct(summary['target']['loo_mdape'], 0)} % for "
        f"{', '.join(summary['target']['gpus'])} on every app: "
        f"**{'met' if summary['target']['met'] else 'NOT met'}**"
        + ("" if summary["target"]["met"] else f" (misses: {', '.join(summary['target']['misses'])})")
        + ".",
    ]


def _quality_table(pairs: list[dict[str, Any]]) -> list[str]:
    header = ["gpu", "app", "compute from", "batches", "exponent", "LOO MdAPE %", "in-sample MAPE %",
              "1-GPU step MAPE %", "comm MAPE %", "exposed MdAPE %"]  # fmt: skip
    rows = [
        [r["gpu"], r["app"], "**fallback**" if r["compute_fallback"] else "1-GPU", r["n_batches"],
         r["exponent_mode"] + (", alpha=0" if r["alpha_held_zero"] else ""), pct(r["loo_mdape"]),
         pct(r["fit_mape"]), pct(r["single_gpu_step_mape"]), pct(r["comm_fit_mape"]), pct(r["comm_exposed_mdape"])]
        for r in pairs
    ]  # fmt: skip
    return table(header, rows, align="lllrlrrrrr")


def _fallback_line(pairs: list[dict[str, Any]]) -> str:
    fallback = [f"{r['gpu']}/{r['app']}" for r in pairs if r["compute_fallback"]]
    return (
        "Fallback pairs (compute fitted to the median over placements of step - sync, no one-GPU "
        "rows to fit): " + (", ".join(fallback) if fallback else "none") + "."
    )


def _g4(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return "n/a" if v is None else f"{v:.4g}"


def _parameter_table(pairs: list[dict[str, Any]]) -> list[str]:
    compute_keys = ["alpha_s", "beta_s", "exponent", "host_s", "k"]
    comm_keys = ["alpha_intra_s", "beta_intra_s", "alpha_inter_s", "beta_inter_s", "gamma"]
    header = ["gpu", "app", *compute_keys, "max_batch", *comm_keys]
    rows = [
        [r["gpu"], r["app"], *(_g4(r["compute"], k) for k in compute_keys), r["compute"]["max_batch"],
         *(_g4(r.get("comm") or {}, k) for k in comm_keys)]
        for r in pairs
    ]  # fmt: skip
    return table(header, rows, align="ll" + "r" * 11)


def _check(pairs: list[dict[str, Any]]) -> tuple[list[str], ...]:
    intro = [
        "If `sync_time_s` were only the all-reduce, `step_time_s - sync_time_s` of a multi-GPU row "
        "would match the one-GPU step time. Ratio = median over all placements of step - sync / "
        "one-GPU step time, over the batches that have a one-GPU row. A ratio well below 1 means "
        "the multi-GPU rows count part of the per-step work (e.g. a host floor) in `sync_time_s`; "
        "that is why the compute model is fitted to the one-GPU rows.",
        "",
    ]
    rows = []
    for r in pairs:
        c = r["single_gpu_check"]
        if c["n_batches"] == 0:
            rows.append([r["gpu"], r["app"], 0, "n/a", "n/a", "n/a", "no one-GPU rows"])
            continue
        rows.append(
            [r["gpu"], r["app"], c["n_batches"], f"{c['median_ratio']:.3f}", f"{c['min_ratio']:.3f}",
             f"{c['max_ratio']:.3f}", "**yes**" if r["single_gpu_flagged"] else "no"]
        )  # fmt: skip
    header = ["gpu", "app", "batches", "median ratio", "min ratio", "max ratio", "flagged"]
    flagged = [f"{r['gpu']}/{r['app']}" for r in pairs if r["single_gpu_flagged"]]
    verdict = [
        "",
        f"Flagged (median ratio off by more than {pct(SINGLE_GPU_FLAG, 0)} %, or one batch off by "
        f"more than {pct(SINGLE_GPU_FLAG_ANY, 0)} %): "
        + (", ".join(flagged) if flagged else "none")
        + ". For a fallback pair this difference is an error of its compute model.",
    ]
    return intro, table(header, rows, align="llrrrrl"), verdict


def pair_entry(p: ComputeParams, d: dict[str, Any], comm: CommParams | None) -> dict[str, Any]:
    """One (gpu, app) row of the report summary: fit quality, the single-GPU check, the parameters."""
    sc = d["single_gpu_check"]
    return {
        "gpu": p.gpu,
        "app": p.app,
        "compute_source": d["compute_source"],
        "compute_fallback": d["compute_fallback"],
        "alpha_held_zero": d["alpha_held_zero"],
        "n_batches": d["n_batches"],
        "exponent_mode": d["exponent_mode"],
        "loo_mdape": p.loo_mdape,
        "fit_mape": p.fit_mape,
        "comm_fit_mape": comm.fit_mape if comm else None,
        "comm_exposed_mape": d["comm"]["exposed_mape"] if comm else None,
        "comm_exposed_mdape": d["comm"]["exposed_mdape"] if comm else None,
        "comm_notes": list(d["comm"]["notes"]) if comm else [],
        "single_gpu_check": sc,
        "single_gpu_flagged": single_gpu_flagged(sc),
        "single_gpu_step_mape": d["single_gpu_step_mape"],
        "compute": {k: getattr(p, k) for k in ("alpha_s", "beta_s", "exponent", "host_s", "k", "max_batch")},
        "comm": (
            {
                k: getattr(comm, k)
                for k in (
                    "alpha_intra_s",
                    "beta_intra_s",
                    "alpha_inter_s",
                    "beta_inter_s",
                    "gamma",
                )
            }
            if comm
            else None
        ),
    }


def fit_hardware(
    table_path: Path,
    out_dir: Path,
    report_dir: Path,
    target_loo_mdape: float = 0.10,
    target_gpus: tuple[str, ...] = ("T4", "V100"),
    host_floor_pairs: tuple[tuple[str, str], ...] = HOST_FLOOR_PAIRS,
) -> dict[str, Any]:
    """Fit every (gpu, app) pair of the table at ``table_path``; write the model files and the report.

    Returns:
        The report summary (the content of ``hardware_fit.json``).
    """
    table = read_profile_table(table_path)
    computes, comms, diagnostics = fit_all(table, host_floor_pairs)
    comm_by_pair = {(c.gpu, c.app): c for c in comms}
    source = describe_file(table_path)

    compute_doc = {
        "generated_by": COMMAND,
        "source": source,
        "equation": COMPUTE_EQUATION,
        "exponent_rule": EXPONENT_RULE,
        "host_floor_rule": HOST_FLOOR_RULE,
        "host_floor_pairs": [list(p) for p in host_floor_pairs],
        "fallback_source": SOURCE_PLACEMENT_MEDIAN,
        "models": [compute_entry(p, diagnostics[(p.gpu, p.app)]) for p in computes],
    }
    comm_doc = {
        "generated_by": COMMAND,
        "source": source,
        "equation": COMM_EQUATION,
        "models": [comm_entry(c, diagnostics[(c.gpu, c.app)]) for c in comms],
    }

    pairs = [pair_entry(p, diagnostics[(p.gpu, p.app)], comm_by_pair.get((p.gpu, p.app))) for p in computes]
    misses = [
        f"{r['gpu']}/{r['app']} ({pct(r['loo_mdape'])} %)"
        for r in pairs
        if r["gpu"] in target_gpus and not (r["loo_mdape"] <= target_loo_mdape)
    ]
    summary = {
        "command": COMMAND,
        "source": source,
        "compute_equation": COMPUTE_EQUATION,
        "comm_equation": COMM_EQUATION,
        "exponent_rule": EXPONENT_RULE,
        "host_floor_rule": HOST_FLOOR_RULE,
        "host_floor_pairs": [list(p) for p in host_floor_pairs],
        "min_one_gpu_batches": MIN_ONE_GPU_BATCHES,
        "target": {
            "loo_mdape": target_loo_mdape,
            "gpus": list(target_gpus),
            "met": not misses,
            "misses": misses,
        },
        "pairs": pairs,
    }
    # Round once so the markdown (and the caveats) show exactly the figures of the JSON.
    summary = json.loads(dump_json(summary, **JSON_ROUNDING))
    summary["data_caveats"] = data_caveats(table, summary["pairs"], list(host_floor_pairs))

    atomic_write_text(out_dir / COMPUTE_MODELS_FILE, dump_json(compute_doc, **JSON_ROUNDING))
    atomic_write_text(out_dir / COMM_MODELS_FILE, dump_json(comm_doc, **JSON_ROUNDING))
    atomic_write_text(report_dir / REPORT_JSON, dump_json(summary, **JSON_ROUNDING))
    atomic_write_text(report_dir / REPORT_MD, render_markdown(summary))
    log.info("wrote %s, %s to %s", COMPUTE_MODELS_FILE, COMM_MODELS_FILE, out_dir)
    log.info("wrote %s, %s to %s", REPORT_MD, REPORT_JSON, report_dir)
    if misses:
        log.warning("LOO MdAPE target missed: %s", ", ".join(misses))
    fallback = [f"{r['gpu']}/{r['app']}" for r in pairs if r["compute_fallback"]]
    if fallback:
        log.warning("compute fitted to the placement median (no one-GPU rows): %s", ", ".join(fallback))
    return summary


@hydra.main(version_base=None, config_path="../conf", config_name="fit_hardware")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the worst LOO MdAPE over the target GPU types."""
    table = Path(to_absolute_path(cfg.table)) if cfg.table else data_path("reference/throughput_profiles.csv")
    out_dir = Path(to_absolute_path(cfg.out_dir)) if cfg.out_dir else Path(sim.__file__).parent / "data"
    report_dir = Path(to_absolute_path(cfg.report_dir))
    summary = fit_hardware(
        table,
        out_dir,
        report_dir,
        target_loo_mdape=float(cfg.target_loo_mdape),
        target_gpus=tuple(cfg.target_gpus),
        host_floor_pairs=parse_pairs(cfg.host_floor_pairs),
    )
    worst = [r["loo_mdape"] for r in summary["pairs"] if r["gpu"] in tuple(cfg.target_gpus)]
    return float(max(worst)) if worst else float("nan")


if __name__ == "__main__":
    main()
