"""The fidelity app as a deployment campaign (issue "deploy without fear"): the profile measured right
before the runs, learned bundles fine-tuned in it, and the verdicts a user deploying them cares about.

1. **Calibrate right before** (``calibrate.quick=true``): the quick step-time ladder of
   ``experiments.deploy`` (:func:`experiments.deploy_calibration.quick_calibrate`, at most
   ``calibrate.max_s``) on the fidelity app's own ranks at native speed, the stored profile refitted
   (knee included) into ``<out_dir>/profile_refit``; the simulated side of the comparison then runs on
   the refit, and a drift past ``calibrate.max_drift`` stops the campaign unless ``calibrate.refuse=false``.
2. **Fine-tune before deploying** (``finetune=[label, ...]``): each named PPO bundle fine-tuned in the
   refit under the campaign's scenario and interval (:func:`experiments.deploy_finetune.finetune_in_refit`,
   what ``deploy finetune=true`` does) and, when it beats the bundle on held-out simulated seeds, run
   as ``<label>-ft`` beside it; when it does not, ``deploy finetune=true`` would deploy the bundle
   itself, so ``<label>-ft`` *is* ``<label>`` and its real runs are not repeated.
3. **Verdicts** (:func:`deployment_summary`): per controller the real median time to accuracy with a
   percentile bootstrap interval over seeds (a missed target counts its truncation time), each learned
   controller's median over the best static batch's (interval: both resampled), runs that collapsed
   for good (:func:`experiments.sim_to_real.checks.collapses`) and what the guards did.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from adapters.sim2real import GUARD_KEYS
from experiments.common import shown

log = logging.getLogger(__name__)

#: Bootstrap resamples of the medians and their ratios.
RESAMPLES = 1999
#: Guard counts of a run's row (:data:`adapters.sim2real.GUARD_KEYS` but the mode), summed per controller.
GUARD_COLUMNS = tuple(k for k in GUARD_KEYS if k != "guard_mode")
#: Where a fine-tuning of ``label`` writes its run and its record, under ``out_dir``.
FINETUNE_DIR = "finetune_{}"


def finetune_labels(value: Any, specs: Sequence[dict[str, Any]]) -> list[str]:
    """``finetune``: labels of PPO controllers among ``specs``, or an error naming what is wrong."""
    labels = [] if value is None else list(value)
    ppo = {sp["label"] for sp in specs if sp["name"] == "ppo"}
    for lab in labels:
        if not isinstance(lab, str):
            raise ValueError(f"finetune lists controller labels, got {lab!r}")
        if lab not in ppo:
            raise ValueError(
                f"finetune: {lab!r} is not a PPO controller of this run (PPO labels: {sorted(ppo) or 'none'})"
            )
    return labels


def _opening(rec: dict[str, Any], default: int) -> int:
    """The first interval's local batch of a kept fine-tune: its opening when one was applied."""
    op = rec.get("opening") or {}
    return int(op["chosen"]) if op.get("applied") else int(default)


def with_finetuned(specs: list[dict[str, Any]], finetuned: dict[str, Any]) -> list[dict[str, Any]]:
    """``specs`` and, per kept fine-tuning record (label -> record), its ``<label>-ft`` spec (at
    the opening the fine-tune chose, when it applied one)."""
    return specs + [
        {
            **sp,
            "label": f"{lab}-ft",
            "kwargs": {**sp["kwargs"], "path": rec["finetuned"]},
            "initial_batch": _opening(rec, sp["initial_batch"]),
        }
        for lab, rec in finetuned.items()
        if rec["kept"]
        for sp in specs
        if sp["label"] == lab
    ]


def ladder_backend(real_config: dict[str, Any]) -> Any:
    """Real ranks of the campaign's task at native speed (no scenario), their target unreachable:
    what the quick ladder measures."""
    from adapters.config import RealDDPConfig
    from adapters.ddp_backend import DDPBackend
    from adapters.tasks import unreachable_target

    return DDPBackend(RealDDPConfig(**{**real_config, **unreachable_target(real_config["dataset"])}))


def calibrate_and_finetune(
    cfg: Any,
    profile: Any,
    real_config: dict[str, Any],
    scenario: Any,
    specs: list[dict[str, Any]],
    interval: int,
    out: Path,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """Steps 1 and 2 of the module docstring: the profile the simulated side uses, the controller
    specs (fine-tuned ones added) and the record of what was measured, trained and kept."""
    from experiments.deploy_calibration import REFIT_DIR, QuickCalibration, quick_calibrate
    from experiments.deploy_finetune import Finetuning, check_finetune, finetune_in_refit
    from sim.profile import load_profile

    calibration = QuickCalibration.from_config(cfg.get("calibrate"))
    labels = finetune_labels(cfg.get("finetune"), specs)
    finetuning = Finetuning.from_config(cfg.get("finetuning"))
    if labels and not calibration.quick:
        raise ValueError(
            "finetune=[...] fine-tunes in the profile measured right before: set calibrate.quick=true"
        )
    record: dict[str, Any] = {"calibration": None, "finetune": {}}
    if not calibration.quick:
        return profile, specs, record
    out.mkdir(parents=True, exist_ok=True)
    from dynamix_gym.measurement.profiling import quiet_wait

    quiet_wait(cfg.quiet)  # the ladder is a measurement too
    backend = ladder_backend(real_config)
    try:
        record["calibration"] = quick_calibrate(
            backend, profile, calibration, out, int(cfg.get("seed", 0)), interval=interval
        )
    finally:
        backend.close()
    refit_dir = out / REFIT_DIR
    refit = load_profile(refit_dir)
    from adapters.sim2real import spec_controller

    for lab in labels:
        sp = next(s for s in specs if s["label"] == lab)
        controller = check_finetune(spec_controller(sp), True)
        _, rec = finetune_in_refit(
            controller,
            refit_dir,
            scenario,
            interval,
            finetuning,
            out / FINETUNE_DIR.format(lab),
            int(cfg.get("seed", 0)),
            job_batch=int(sp["initial_batch"]),
            ladder=tuple(calibration.batches),
        )
        record["finetune"][lab] = rec
        if not rec["kept"]:
            log.info(
                "finetune %s: not kept, so %s-ft is %s itself (its runs are not repeated)", lab, lab, lab
            )
    return refit, with_finetuned(specs, record["finetune"]), record


def reloaded(
    out: Path, cfg: Any, profile: Any, specs: list[dict[str, Any]]
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """``reanalyse=true``: what :func:`calibrate_and_finetune` returned when ``out`` was measured."""
    import json

    from experiments.deploy_calibration import RECORD_FILE, REFIT_DIR
    from experiments.deploy_finetune import RECORD_FILE as FINETUNE_RECORD
    from sim.profile import load_profile

    record: dict[str, Any] = {"calibration": None, "finetune": {}}
    if not (cfg.get("calibrate") or {}).get("quick"):
        return profile, specs, record
    record["calibration"] = json.loads((out / RECORD_FILE).read_text())
    for sp in specs:
        f = out / FINETUNE_DIR.format(sp["label"]) / FINETUNE_RECORD
        if f.is_file():
            record["finetune"][sp["label"]] = json.loads(f.read_text())
    return load_profile(out / REFIT_DIR), with_finetuned(specs, record["finetune"]), record


def _scores(g: pd.DataFrame) -> np.ndarray:
    """A controller's real scores: time to accuracy, or the truncation time of a missed target."""
    return np.asarray(np.where(g["reached"], g["tta_s"], g["total_time_s"]), dtype=np.float64)


def _median_ci(x: np.ndarray, seed: int) -> list[float]:
    if len(x) < 2:
        return [math.nan, math.nan]
    b = stats.bootstrap(
        (x,), np.median, n_resamples=RESAMPLES, method="percentile", random_state=np.random.default_rng(seed)
    )
    return [float(b.confidence_interval.low), float(b.confidence_interval.high)]


def _ratio_ci(x: np.ndarray, y: np.ndarray, seed: int) -> list[float]:
    """Percentile interval of median(x) / median(y), the two samples resampled independently."""
    if len(x) < 2 or len(y) < 2:
        return [math.nan, math.nan]
    b = stats.bootstrap(
        (x, y),
        lambda a, c: np.median(a) / np.median(c),
        vectorized=False,
        paired=False,
        n_resamples=RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return [float(b.confidence_interval.low), float(b.confidence_interval.high)]


def deployment_summary(
    runs: pd.DataFrame,
    specs: Sequence[dict[str, Any]],
    collapsed: Sequence[dict[str, Any]],
    record: dict[str, Any],
    targets: dict[str, Any],
) -> dict[str, Any]:
    """Step 3 of the module docstring, for ``summary.json`` (key ``deployment``)."""
    real = runs[runs.backend == "real"]
    groups = dict(list(real.groupby("controller", sort=False)))
    labels = [sp["label"] for sp in specs if sp["label"] in groups]
    per: dict[str, Any] = {}
    for i, lab in enumerate(labels):
        g = groups[lab]
        x = _scores(g)
        row = {
            "runs": len(g),
            "reached": int(g["reached"].sum()),
            "median_s": float(np.median(x)),
            "median_ci95": _median_ci(x, i),
            "collapsed_for_good": sum(1 for c in collapsed if c["controller"] == lab),
        }
        for col in GUARD_COLUMNS:
            if col in g:
                row[col] = float(pd.to_numeric(g[col], errors="coerce").fillna(0).sum())
        per[lab] = row
    static = [sp["label"] for sp in specs if sp["static"] and sp["label"] in per]
    best = min(static, key=lambda lab: per[lab]["median_s"]) if static else None
    learned: dict[str, Any] = {}
    kinds = {sp["label"]: sp["name"] for sp in specs}
    aliases = {f"{lab}-ft": lab for lab, rec in record.get("finetune", {}).items() if not rec["kept"]}
    for j, lab in enumerate([*labels, *aliases]):
        source = aliases.get(lab, lab)
        if kinds.get(source) != "ppo" or best is None:
            continue
        x, y = _scores(groups[source]), _scores(groups[best])
        learned[lab] = {
            "runs_of": source,
            "finetuned": lab.endswith("-ft"),
            "median_over_best_static": float(np.median(x) / np.median(y)),
            "ci95": _ratio_ci(x, y, 100 + j),
        }
    zero, tuned = targets.get("zero_shot_over_best_static"), targets.get("finetuned_over_best_static")
    for row in learned.values():
        limit = tuned if row["finetuned"] else zero
        row["target"] = limit
        row["met"] = None if limit is None else bool(row["median_over_best_static"] <= limit)
    guarded = {lab: per[lab] for lab in learned if lab in per}
    return {
        "per_controller": per,
        "best_static": best,
        "learned": learned,
        "collapses_learned": int(sum(r["collapsed_for_good"] for r in guarded.values())),
        "calibration": _calibration_brief(record.get("calibration")),
        "finetune": {
            lab: {
                "kept": bool(rec["kept"]),
                "mean_tta_s": rec["mean_tta_s"],
                # records before the imitation method were PPO's alone, timed by its updates
                "method": rec.get("method", "ppo"),
                "timesteps": rec["train"]["timesteps"],
                "seconds": rec["train"].get("seconds") or rec["train"]["train_seconds"],
                "imitation": _imitation_brief(rec["train"].get("imitation")),
                "finetuned": rec["finetuned"],
                "opening": rec.get("opening"),
            }
            for lab, rec in record.get("finetune", {}).items()
        },
    }


def _imitation_brief(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    if not stats:
        return None
    return {
        "expert": stats["expert"],
        "episodes": stats["episodes"],
        "dagger_rounds": len(stats.get("dagger") or []),
        "action_agreement": stats["action_agreement"],
        "expert_mean_tta_s": stats["expert_mean_tta_s"],
    }


def _calibration_brief(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {
        "refit_profile": rec["refit_profile"],
        "stored_profile": rec["stored_profile"],
        "measured_utc": rec["measured_utc"],
        "ladder": rec["ladder"]["message"],
        "max_drift": rec["drift"]["max_drift"],
        "refit_max_error": rec["drift"].get("refit_max_error"),  # None: a record from before the comm refit
        "comm_refit": rec.get("comm_refit"),
        "overheads": rec.get("overheads"),
        "verdict": rec["verdict"],
    }


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def deployment_lines(d: dict[str, Any] | None) -> list[str]:
    """The report's "Deployment" section."""
    from experiments.deploy_calibration import comm_line, overhead_line

    if d is None:
        return []
    out = ["## Deployment", ""]
    cal = d["calibration"]
    if cal is None:
        out += ["- Profile: the stored one (calibrate.quick=false: not measured right before the runs).", ""]
    else:
        err = cal.get("refit_max_error")
        against = "from the refit" if err is None else f"from the measured ones (the refit's: {err:.1%})"
        comm = cal.get("comm_refit")
        refits = "" if comm is None else f" {_sentence(comm_line(comm)[2:])}."
        refits += f" {_sentence(overhead_line(cal.get('overheads'))[2:])}."  # None: not measured
        out += [
            f"- Profile measured right before the runs ({cal['measured_utc']}): the quick ladder ({cal['ladder']}) "
            f"refitted {cal['stored_profile']} into {cal['refit_profile']}; the stored profile's step times drift "
            f"{cal['max_drift']:.1%} at most {against} ({cal['verdict']}).{refits} The simulated side runs on "
            "the refit.",
        ]
    for lab, ft in d["finetune"].items():
        m = ft["mean_tta_s"]
        how = f"{ft['timesteps']} PPO timesteps"
        im = ft.get("imitation")
        if im:
            how = (
                f"DAgger from its weights with the {im['expert']} expert: {im['episodes']} episodes, "
                f"{im['dagger_rounds']} rounds, {im['action_agreement']:.0%} agreement; then {how}"
            )
        op = ft.get("opening")
        opened = ""
        if op:
            tried = ", ".join(f"{b}: {v:.2f} s" for b, v in op["expert_mean_tta_s"].items())
            opened = (
                f"; opening chosen in the refit by the expert's mean time to accuracy from each local batch ({tried}): "
                f"{op['chosen']}" + ("" if op["applied"] else f" (not applied: the job's {op['job']} stays)")
            )
        out.append(
            f"- Fine-tuned {lab} in the refit ({how}; {ft['seconds']:.0f} s{opened}): mean time "
            f"to accuracy on held-out simulated seeds {m['finetuned']:.2f} s vs the bundle's {m['bundle']:.2f} s: "
            + (
                f"kept ({shown(Path(ft['finetuned']))}), run as {lab}-ft"
                if ft["kept"]
                else f"not kept ({lab}-ft is {lab})"
            )
        )
    out += [
        "",
        "Real runs: median time to accuracy (a missed target counts its truncation time) with a 95 % "
        "percentile bootstrap interval over seeds; runs that fell back to chance for good; what the guards did.",
        "",
        "| controller | runs | reached | median (s) | 95 % interval | collapsed for good | guard firings | rollbacks | time lost (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lab, r in d["per_controller"].items():
        lo, hi = r["median_ci95"]
        out.append(
            f"| {lab} | {r['runs']} | {r['reached']} | {r['median_s']:.2f} | [{lo:.2f}, {hi:.2f}] | "
            f"{r['collapsed_for_good']} | {r.get('guard_firings', 0):.0f} | {r.get('guard_rollbacks', 0):.0f} | "
            f"{r.get('guard_time_lost_s', 0.0):.1f} |"
        )
    out += ["", f"Best static batch by real median: {d['best_static']}.", ""]
    if d["learned"]:
        out += [
            "| learned controller | median / best static | 95 % interval | target | |",
            "|---|---|---|---|---|",
        ]
        for lab, r in d["learned"].items():
            lo, hi = r["ci95"]
            verdict = "" if r["met"] is None else ("(met)" if r["met"] else "(missed)")
            of = "" if r["runs_of"] == lab else f" (the runs of {r['runs_of']})"
            target = "" if r["target"] is None else f"<= {r['target']:g}"
            out.append(
                f"| {lab}{of} | **{r['median_over_best_static']:.3f}** | [{lo:.3f}, {hi:.3f}] | {target} | {verdict} |"
            )
        out += ["", f"Learned controllers' runs that collapsed for good: {d['collapses_learned']}.", ""]
    return out
