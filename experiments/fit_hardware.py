"""Fit the simulator's compute and communication models from measured step times.

    python -m experiments.fit_hardware [profile=TABLE.csv] [out_dir=DIR] [report_dir=DIR]

Writes ``compute_models.json`` and ``comm_models.json`` (default: the package's ``sim/data``) and
``hardware_fit.md`` / ``hardware_fit.json`` (default: ``results/fit``). The work is in
:mod:`sim.fitting`; this file only resolves paths, serialises and writes the report. Output is
deterministic: a rerun on the same table gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

import sim
from sim.datafiles import data_path
from sim.fitting import (
    COMM_EQUATION,
    COMPUTE_EQUATION,
    EXPONENT_RULE,
    fit_all,
    read_profile_table,
)
from sim.hardware import COMPUTE_MODELS_FILE, ComputeParams
from sim.network import COMM_MODELS_FILE, CommParams

log = logging.getLogger(__name__)

COMMAND = "python -m experiments.fit_hardware"
REPORT_MD = "hardware_fit.md"
REPORT_JSON = "hardware_fit.json"
REPO_ROOT = Path(sim.__file__).resolve().parent.parent
#: A pair is flagged in the report when its median-over-placements compute time differs from its
#: one-GPU step time by more than SINGLE_GPU_FLAG (median over batches) or by more than
#: SINGLE_GPU_FLAG_ANY at any one batch.
SINGLE_GPU_FLAG = 0.10
SINGLE_GPU_FLAG_ANY = 0.20


def single_gpu_flagged(check: dict[str, Any]) -> bool:
    if check["n_batches"] == 0:
        return False
    worst = max(abs(check["min_ratio"] - 1.0), abs(check["max_ratio"] - 1.0))
    return abs(check["median_ratio"] - 1.0) > SINGLE_GPU_FLAG or worst > SINGLE_GPU_FLAG_ANY


def rounded(value: Any, digits: int = 6) -> Any:
    """Floats to ``digits`` significant digits (NaN -> None, |x| < 1e-12 -> 0), recursively."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if abs(value) < 1e-12:
            return 0.0
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {str(k): rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; these are ordinary shared files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump_json(doc: dict[str, Any]) -> str:
    return json.dumps(rounded(doc), indent=2, sort_keys=True, allow_nan=False) + "\n"


def describe_source(profile: Path) -> dict[str, str]:
    """Repo-relative path (absolute outside the repo) and SHA-256 of the profile table."""
    try:
        shown = profile.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        shown = str(profile.resolve())
    digest = hashlib.sha256(profile.read_bytes()).hexdigest()
    return {"path": shown, "sha256": digest}


def per_batch(errors: dict[int, float]) -> list[list[float]]:
    return [[int(b), float(e)] for b, e in sorted(errors.items())]


def compute_entry(p: ComputeParams, diag: dict[str, Any]) -> dict[str, Any]:
    entry = {k: v for k, v in asdict(p).items()}
    entry.update(
        n_batches=diag["n_batches"],
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


def render_markdown(summary: dict[str, Any]) -> str:
    """The human-readable report; every figure comes from ``summary`` (= hardware_fit.json)."""
    lines = [
        "# Hardware model fit",
        "",
        f"Generated by `{summary['command']}` from `{summary['source']['path']}` "
        f"(sha256 `{summary['source']['sha256'][:12]}`). Do not edit by hand; rerun the command.",
        "",
        f"- Compute: `{summary['compute_equation']}`.",
        "  Fitted with `scipy.optimize.least_squares` on log residuals, soft_l1 loss, bounded "
        f"parameters, fixed initial guesses; {summary['exponent_rule']}.",
        f"- Communication: `{summary['comm_equation']}`.",
        "- LOO MdAPE: leave-one-batch-size-out median absolute percentage error of the compute "
        "model (fit on all other batch sizes, predict the held-out one). The exponent mode was "
        "chosen by this same figure, so it is slightly optimistic where the free exponent won.",
        "- In-sample MAPE: compute model vs the per-batch median compute times. Comm MAPE: "
        "predicted vs measured step time over all multi-GPU rows. Exposed MdAPE: predicted "
        "exposed comm (step - T_compute) vs measured `sync_time_s`, median over the same rows.",
        "",
        f"Target: LOO MdAPE <= {pct(summary['target']['loo_mdape'], 0)} % for "
        f"{', '.join(summary['target']['gpus'])} on every app: "
        f"**{'met' if summary['target']['met'] else 'NOT met'}**"
        + ("" if summary["target"]["met"] else f" (misses: {', '.join(summary['target']['misses'])})")
        + ".",
        "",
        "## Fit quality",
        "",
        "| gpu | app | batches | exponent | LOO MdAPE % | in-sample MAPE % | comm MAPE % "
        "| exposed MdAPE % | 1-GPU step MAPE % |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["pairs"]:
        lines.append(
            f"| {r['gpu']} | {r['app']} | {r['n_batches']} | {r['exponent_mode']} "
            f"| {pct(r['loo_mdape'])} | {pct(r['fit_mape'])} | {pct(r['comm_fit_mape'])} "
            f"| {pct(r['comm_exposed_mdape'])} | {pct(r['single_gpu_step_mape'])} |"
        )
    lines += [
        "",
        "## Fitted parameters",
        "",
        "| gpu | app | alpha_s | beta_s | exponent | host_s | k | max_batch "
        "| alpha_intra_s | beta_intra_s | alpha_inter_s | beta_inter_s | gamma |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["pairs"]:
        c, m = r["compute"], r.get("comm") or {}

        def g(d: dict[str, Any], key: str) -> str:
            v = d.get(key)
            return "n/a" if v is None else f"{v:.4g}"

        lines.append(
            f"| {r['gpu']} | {r['app']} | {g(c, 'alpha_s')} | {g(c, 'beta_s')} | {g(c, 'exponent')} "
            f"| {g(c, 'host_s')} | {g(c, 'k')} | {c['max_batch']} | {g(m, 'alpha_intra_s')} "
            f"| {g(m, 'beta_intra_s')} | {g(m, 'alpha_inter_s')} | {g(m, 'beta_inter_s')} "
            f"| {g(m, 'gamma')} |"
        )
    lines += [
        "",
        "## Check: median-over-placements compute time vs one-GPU step time",
        "",
        "Compute time per batch is the median over all placements of `step_time_s - sync_time_s`. "
        "For a one-GPU job `sync_time_s` is ~0, so its step time should match. Ratio = median "
        "compute / one-GPU step time, over the batches that have a one-GPU row.",
        "",
        "| gpu | app | batches | median ratio | min ratio | max ratio | flagged |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in summary["pairs"]:
        s = r["single_gpu_check"]
        lines.append(
            f"| {r['gpu']} | {r['app']} | {s['n_batches']} | {s['median_ratio']:.3f} "
            f"| {s['min_ratio']:.3f} | {s['max_ratio']:.3f} "
            f"| {'**yes**' if r['single_gpu_flagged'] else 'no'} |"
        )
    flagged = [f"{r['gpu']}/{r['app']}" for r in summary["pairs"] if r["single_gpu_flagged"]]
    lines += [
        "",
        f"Flagged (median ratio off by more than {pct(SINGLE_GPU_FLAG, 0)} %, or one batch off by "
        f"more than {pct(SINGLE_GPU_FLAG_ANY, 0)} %): "
        + (", ".join(flagged) if flagged else "none")
        + ". A flagged pair's compute model follows the multi-GPU placements, whose step - sync "
        "differs from the one-GPU step; how far it misses one-GPU jobs is the last column "
        "(1-GPU step MAPE) of the first table.",
        "",
    ]
    notes = [f"- {r['gpu']}/{r['app']}: {n}" for r in summary["pairs"] for n in r["comm_notes"]]
    if notes:
        lines += ["## Notes", "", *notes, ""]
    return "\n".join(lines)


def fit_hardware(
    profile: Path,
    out_dir: Path,
    report_dir: Path,
    target_loo_mdape: float = 0.10,
    target_gpus: tuple[str, ...] = ("T4", "V100"),
) -> dict[str, Any]:
    """Fit every (gpu, app) pair of ``profile``; write the model files and the report.

    Returns:
        The report summary (the content of ``hardware_fit.json``).
    """
    table = read_profile_table(profile)
    computes, comms, diagnostics = fit_all(table)
    comm_by_pair = {(c.gpu, c.app): c for c in comms}
    source = describe_source(profile)

    compute_doc = {
        "generated_by": COMMAND,
        "source": source,
        "equation": COMPUTE_EQUATION,
        "exponent_rule": EXPONENT_RULE,
        "models": [compute_entry(p, diagnostics[(p.gpu, p.app)]) for p in computes],
    }
    comm_doc = {
        "generated_by": COMMAND,
        "source": source,
        "equation": COMM_EQUATION,
        "models": [comm_entry(c, diagnostics[(c.gpu, c.app)]) for c in comms],
    }

    pairs = []
    for p in computes:
        d = diagnostics[(p.gpu, p.app)]
        comm = comm_by_pair.get((p.gpu, p.app))
        sc = d["single_gpu_check"]
        pairs.append(
            {
                "gpu": p.gpu,
                "app": p.app,
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
                "compute": {
                    k: getattr(p, k) for k in ("alpha_s", "beta_s", "exponent", "host_s", "k", "max_batch")
                },
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
        )
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
        "target": {
            "loo_mdape": target_loo_mdape,
            "gpus": list(target_gpus),
            "met": not misses,
            "misses": misses,
        },
        "pairs": pairs,
    }
    # Round once so the markdown shows exactly the figures of the JSON.
    summary = json.loads(dump_json(summary))

    write_atomic(out_dir / COMPUTE_MODELS_FILE, dump_json(compute_doc))
    write_atomic(out_dir / COMM_MODELS_FILE, dump_json(comm_doc))
    write_atomic(report_dir / REPORT_JSON, dump_json(summary))
    write_atomic(report_dir / REPORT_MD, render_markdown(summary))
    log.info("wrote %s, %s to %s", COMPUTE_MODELS_FILE, COMM_MODELS_FILE, out_dir)
    log.info("wrote %s, %s to %s", REPORT_MD, REPORT_JSON, report_dir)
    if misses:
        log.warning("LOO MdAPE target missed: %s", ", ".join(misses))
    return summary


@hydra.main(version_base=None, config_path="../conf", config_name="fit_hardware")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the worst LOO MdAPE over the target GPU types."""
    profile = (
        Path(to_absolute_path(cfg.profile)) if cfg.profile else data_path("reference/throughput_profiles.csv")
    )
    out_dir = Path(to_absolute_path(cfg.out_dir)) if cfg.out_dir else Path(sim.__file__).parent / "data"
    report_dir = Path(to_absolute_path(cfg.report_dir))
    summary = fit_hardware(
        profile,
        out_dir,
        report_dir,
        target_loo_mdape=float(cfg.target_loo_mdape),
        target_gpus=tuple(cfg.target_gpus),
    )
    worst = [r["loo_mdape"] for r in summary["pairs"] if r["gpu"] in tuple(cfg.target_gpus)]
    return float(max(worst)) if worst else float("nan")


if __name__ == "__main__":
    main()
