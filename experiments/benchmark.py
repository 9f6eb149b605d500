"""dynamix-bench-v1: score a controller on a split of the benchmark, against the hindsight limit.

    python -m experiments.benchmark controller=hindsight split=test      # the limit (run it first)
    python -m experiments.benchmark controller=static split=test         # every static batch; best per task
    python -m experiments.benchmark controller=dlb split=test
    python -m experiments.benchmark controller=ppo controller.path=results/headline/policy label=ppo-headline
    python -m experiments.benchmark controller=dlb split=test hydra/launcher=submitit_slurm

The suite (:mod:`dynamix_gym.benchmark`) is declared in ``conf/benchmark/v1.yaml``: tasks (workload x cluster x scenario, each a
config name) in splits ``train`` (training, tuning, imitation) and ``test`` (scoring alone), with the
seeds of each split. A plain run orchestrates: it launches a Hydra multirun of this app over
``task`` x ``seed`` (x ``controller.batch`` for the static grid) through the configured launcher
(joblib locally, submitit on SLURM), then scores what came back. Each multirun job (``task=<name>``
set) runs one episode and writes its ``timeline.csv`` and a ``run.json`` row.

Scoring (:func:`score`, with :mod:`dynamix_gym.benchmark.scoring`'s one rule), written to ``results/benchmark/<label>/<split>/`` as ``runs.csv``,
``summary.json`` and ``summary.md`` (the command at the top):

* per task and seed: the time to accuracy, the hindsight limit's (``results/benchmark/hindsight``),
  the best static batch's (``results/benchmark/static``: the one batch per task with the best mean
  over the task's seeds; a static job runs at its batch from the first interval, every other
  controller starts at the workload's initial batch), whether the target was reached;
* the protocol: every controller decides every ``interval`` (K) iterations, the first time after
  one K-iteration interval at its start batches; the limit is the best schedule *within* that
  protocol. A controller that decided sooner could beat it where the first interval is a large
  share of a short run: the time-to-target oracle with a 5-iteration first interval reaches
  ``ncf_t4v100_jitter`` seed 101 in 24.5 s against the limit's 40.9 s, ``ncf_a100t4_congestion``
  seed 101 in 4.2 s against 6.9 s, the BERT tasks 5-11% sooner (tried 2026-12-02, not adopted;
  the universal policy, retrained for short first intervals, gained less than that limit would);
* ``ratio`` = (TTA, or the time budget if the target was missed) / the limit's TTA;
* a diagnostic beside the ratio (never instead of it): ``x_limit_from_initial``, TTA over the best
  schedule the planner found that starts at the workload's initial batch, as every adaptive
  controller must (the limit itself may be a static batch that ran its first interval at itself);
* summary scores: the geometric mean of the ratios, the share of runs reaching the target, the
  worst task (highest geometric mean over its seeds). A run faster than the limit is flagged
  (``limit_beaten``): it means the planner missed a schedule, a bug to fix in the planner.

After scoring, ``results/benchmark/<split>_ratios.png`` (TTA / limit per task, every scored
controller side by side) and ``results/benchmark/README.md`` (the scores of every label) are
rebuilt from what is under ``results/benchmark``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate, to_absolute_path
from omegaconf import DictConfig

import dynamix_gym  # noqa: F401  (registers the envs the backend configs name)
from dynamix_gym.benchmark.scoring import best_static as best_static_by_task
from dynamix_gym.benchmark.scoring import geomean as _geomean
from dynamix_gym.benchmark.scoring import scores_s
from dynamix_gym.benchmark.suite import SUITE_NAME, check_suite, split_tasks, task_interval, task_specs
from dynamix_gym.controllers.base import env_options, hooks
from dynamix_gym.evaluation import run_episode
from experiments.common import REPO_ROOT, atomic_write_text, plain, shown
from experiments.evaluate import record_run

log = logging.getLogger(__name__)

#: The label whose runs are the hindsight limit, and the static grid's.
LIMIT_LABEL = "hindsight"
STATIC_LABEL = "static"
#: Keys of the orchestrating run that the multirun sets itself.
_OWN_KEYS = ("task", "seed", "controller.batch", "controller.start_at_batch", "hydra.sweep.dir", "score_only")


# --------------------------------------------------------------------------------------------
# One job of the multirun: one task, one seed
# --------------------------------------------------------------------------------------------
def run_task(cfg: DictConfig, out: Path) -> float:
    tasks, _ = split_tasks(cfg.benchmark, str(cfg.split))
    name = str(cfg.task)
    if name not in tasks:
        raise ValueError(f"task {name!r} is not in split {cfg.split!r}; tasks: {sorted(tasks)}")
    task = tasks[name]
    specs = task_specs(task, cfg.reward)
    overrides = {}
    if "cache_dir" in cfg.controller and cfg.controller.cache_dir is not None:
        overrides["cache_dir"] = to_absolute_path(str(cfg.controller.cache_dir))
    controller = instantiate(cfg.controller, **overrides)
    interval = task_interval(task)
    env = instantiate(cfg.backend)(
        **specs,
        action_mode=controller.action_mode,
        interval=interval,
        **{**plain(cfg.env), **env_options(controller)},
    )
    try:
        spec = env.unwrapped.backend.spec
        if controller.name == "static" and _duplicate_static(int(controller.batch), spec):
            log.info(
                "static-%d on %s: every worker is clipped as at a neighbouring batch; skipped",
                controller.batch,
                name,
            )
            return math.nan
        t0 = time.perf_counter()
        result = run_episode(env, controller, int(cfg.seed), scenario=specs["scenario"].name)
        elapsed = time.perf_counter() - t0
    finally:
        env.close()
    summary, tta = record_run(out, result, controller, specs, spec, interval)
    row = {
        "task": name,
        "split": str(cfg.split),
        "seed": int(cfg.seed),
        "label": str(cfg.label or controller.name),  # the orchestrating run passes default_label
        "controller": summary["controller"],
        "workload": task["workload"],
        "cluster": task["cluster"],
        "scenario": task["scenario"],
        "workers": int(spec.num_workers),
        "reached_target": bool(summary["reached_target"]),
        "time_to_accuracy_s": float(summary["time_to_accuracy_s"]),
        "total_time_s": float(summary["total_time_s"]),
        "time_budget_s": float(spec.time_budget_s),
        "final_metric": summary.get("final_metric", summary["final_accuracy"]),
        "metric": summary.get("metric", "accuracy"),
        "decisions": int(summary["decisions"]),
        "run_s": round(elapsed, 2),
    }
    search = hooks(controller).search_log
    if search:
        row["plan"] = search.get("plan")
        row["search_s"] = search.get("search_s")
        # The best schedule that starts at the workload's initial batch, as every adaptive
        # controller does (the limit may be a static batch that ran its first interval at itself).
        from_initial = [v for k, v in search.get("best_by_kind", {}).items() if k != "static_own_start"]
        if from_initial:
            row["limit_from_initial_s"] = float(min(from_initial))
    atomic_write_text(out / "run.json", json.dumps(row, indent=1, default=str) + "\n")
    return tta


def _duplicate_static(batch: int, spec: Any) -> bool:
    """A static batch whose clipped split equals that of half (or double) the batch adds nothing."""
    clip = lambda b: np.clip(b, spec.min_batch, spec.max_batch).tolist()  # noqa: E731
    return batch > 1 and clip(batch) == clip(batch // 2)


# --------------------------------------------------------------------------------------------
# The orchestrating run: launch the multirun, then score
# --------------------------------------------------------------------------------------------
def static_batches(cfg: DictConfig) -> list[int]:
    if cfg.static_batches is not None:
        return [int(b) for b in cfg.static_batches]
    return [2**k for k in range(3, 16)]  # 8 .. 32768; clipped duplicates are skipped per task


def multirun_command(cfg: DictConfig, sweep_dir: Path) -> list[str]:
    tasks, seeds = split_tasks(cfg.benchmark, str(cfg.split))
    hc = HydraConfig.get()
    forwarded = [o for o in hc.overrides.task if o.split("=", 1)[0].lstrip("+~") not in _OWN_KEYS]
    forwarded += [o for o in hc.overrides.hydra if o.startswith(("hydra/launcher", "hydra.launcher"))]
    cmd = [sys.executable, "-m", "experiments.benchmark", "-m", *forwarded]
    cmd += [f"task={','.join(tasks)}", f"seed={','.join(map(str, seeds))}", f"hydra.sweep.dir={sweep_dir}"]
    if str(cfg.controller.get("_target_", "")).endswith("StaticController"):
        # A static job runs at its batch from the first step (the adaptive ones start at the
        # workload's initial batch): +controller.start_at_batch=true.
        cmd.append(f"controller.batch={','.join(map(str, static_batches(cfg)))}")
        if "start_at_batch" not in cfg.controller:
            cmd.append("+controller.start_at_batch=true")
    return cmd


def orchestrate(cfg: DictConfig) -> dict[str, Any]:
    check_suite(cfg.benchmark)
    label = default_label(cfg)
    split = str(cfg.split)
    root = Path(to_absolute_path(str(cfg.out_root)))
    sweep_dir = root / label / split / "runs"
    if not cfg.score_only:
        cmd = multirun_command(cfg, sweep_dir)
        if not cfg.get("label"):  # every job records the label its runs are scored under
            cmd.append(f"label={label}")
        log.info("benchmark %s, split %s: %s", label, split, " ".join(cmd))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        subprocess.run(cmd, check=True, cwd=os.getcwd(), env=env)
    summary = score(root, label, split, command=benchmark_command(cfg))
    rescore_all(root)  # other labels' ratios move with a new limit or static grid
    return summary


def default_label(cfg: DictConfig) -> str:
    """``label``, or the name of the controller config it ran (``controller=oracle_tta_endgame``
    -> ``oracle_tta_endgame``), or, outside a Hydra run, the controller's own name. Two configs of
    one controller class (``oracle``, ``oracle_tta``) so never share a label's folder, where the
    class name would have written the second over the first's committed runs."""
    if cfg.get("label"):
        return str(cfg.label)
    try:
        choice = HydraConfig.get().runtime.choices.get("controller")
    except ValueError:  # no Hydra run (a composed config)
        choice = None
    return str(choice) if choice else str(instantiate(cfg.controller).name)


def benchmark_command(cfg: DictConfig) -> str:
    hc = HydraConfig.get()
    shown_overrides = [o for o in hc.overrides.task if not o.startswith("score_only")]
    shown_overrides += [o for o in hc.overrides.hydra if o.startswith("hydra/launcher")]
    return " ".join(["python -m experiments.benchmark", *shown_overrides])


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def load_runs(run_dir: Path) -> pd.DataFrame:
    rows = [json.loads(p.read_text()) for p in sorted(run_dir.rglob("run.json"))]
    return pd.DataFrame(rows)


def best_static(runs: pd.DataFrame) -> pd.DataFrame:
    """Per task, the rows of the one static batch with the best mean score over the task's seeds
    (:func:`dynamix_gym.benchmark.scoring.best_static`)."""
    best = best_static_by_task(runs, by=("task",))
    return runs[runs.controller.to_numpy() == best.reindex(runs.task).to_numpy()].reset_index(drop=True)


def _by_task_seed(path: Path) -> pd.DataFrame | None:
    if not path.exists():
        return None
    df = pd.read_csv(path)
    return df.set_index(["task", "seed"])


def score(root: Path, label: str, split: str, command: str = "") -> dict[str, Any]:
    out = root / label / split
    runs = load_runs(out / "runs")
    if runs.empty:
        raise FileNotFoundError(f"no run.json under {shown(out / 'runs')}: nothing to score")
    if label == STATIC_LABEL:
        runs = best_static(runs)
    runs = runs.sort_values(["task", "seed"]).reset_index(drop=True)
    runs["score_s"] = scores_s(runs)
    # The limit's score: its time to accuracy (or its budget, where no schedule reaches the target).
    own = runs.set_index(["task", "seed"])
    limit = own if label == LIMIT_LABEL else _by_task_seed(root / LIMIT_LABEL / split / "runs.csv")
    static = own if label == STATIC_LABEL else _by_task_seed(root / STATIC_LABEL / split / "runs.csv")
    key = list(zip(runs.task, runs.seed, strict=True))
    runs["limit_s"] = [
        limit.loc[k, "score_s"] if limit is not None and k in limit.index else math.nan for k in key
    ]
    runs["best_static_s"] = [
        static.loc[k, "score_s"] if static is not None and k in static.index else math.nan for k in key
    ]
    runs["best_static"] = [
        static.loc[k, "controller"] if static is not None and k in static.index else "" for k in key
    ]
    runs["ratio"] = runs.score_s / runs.limit_s
    runs["x_best_static"] = runs.score_s / runs.best_static_s
    has_initial = limit is not None and "limit_from_initial_s" in limit.columns
    runs["limit_from_initial_s"] = [
        max(float(limit.loc[k, "limit_from_initial_s"]), float(limit.loc[k, "score_s"]))
        if has_initial and k in limit.index
        else math.nan
        for k in key
    ]
    runs["x_limit_from_initial"] = runs.score_s / runs.limit_from_initial_s
    atomic_write_text(out / "runs.csv", runs.to_csv(index=False))
    summary = summarise(runs, label, split, command)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=_json_default) + "\n")
    atomic_write_text(out / "summary.md", to_markdown(runs, summary))
    return summary


def rescore_all(root: Path) -> None:
    """Scores every label and split under ``root`` again (the limit first, then the static grid,
    whose runs the others are read against), keeping each one's command, and rebuilds the index."""
    dirs = sorted(p.parent for p in root.glob("*/*/runs") if p.is_dir())
    rank = {LIMIT_LABEL: 0, STATIC_LABEL: 1}
    for d in sorted(dirs, key=lambda d: (rank.get(d.parent.name, 2), d.parent.name, d.name)):
        old = d / "summary.json"
        command = json.loads(old.read_text()).get("command", "") if old.exists() else ""
        score(root, d.parent.name, d.name, command=command)
    rebuild_index(root)


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


def summarise(runs: pd.DataFrame, label: str, split: str, command: str) -> dict[str, Any]:
    per_task = runs.groupby("task")["ratio"].apply(_geomean)
    beaten = runs[runs.ratio < 1.0 - 1e-9]
    worst = per_task.idxmax() if per_task.notna().any() else None
    return {
        "benchmark": SUITE_NAME,
        "label": label,
        "split": split,
        "command": command,
        "runs": len(runs),
        "tasks": int(runs.task.nunique()),
        "geomean_ratio_to_limit": _geomean(runs.ratio),
        "geomean_ratio_to_best_static": _geomean(runs.x_best_static),
        # a diagnostic beside the limit, never instead of it: TTA over the best schedule that
        # starts at the workload's initial batch (NCF's limit is a static batch run at itself
        # from the first interval, which no adaptive controller can match within the protocol)
        "geomean_ratio_to_limit_from_initial": _geomean(runs.x_limit_from_initial),
        "reached_share": float(runs.reached_target.mean()),
        "worst_task": worst,
        "worst_task_ratio": float(per_task.max()) if worst is not None else math.nan,
        "per_task_ratio": {k: float(v) for k, v in per_task.items()},
        # Sum of the runs' own wall times (each one process, one core; the hindsight limit's
        # includes its search): on two cores the split takes about half of it.
        "run_s_total": float(runs.run_s.sum()) if "run_s" in runs else math.nan,
        "limit_beaten": [
            {"task": r.task, "seed": int(r.seed), "tta_s": float(r.score_s), "limit_s": float(r.limit_s)}
            for r in beaten.itertuples()
        ],
    }


def _f(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def to_markdown(runs: pd.DataFrame, s: dict[str, Any]) -> str:
    lines = [
        f"# dynamix-bench-v1, split `{s['split']}`: {s['label']}",
        "",
        f"    {s['command']}" if s["command"] else "",
        "",
        f"- geometric mean of TTA / hindsight limit: **{_f(s['geomean_ratio_to_limit'])}** "
        f"(a missed target counts its time budget)",
        f"- geometric mean of TTA / best static batch: {_f(s['geomean_ratio_to_best_static'])}",
        f"- geometric mean of TTA / the best schedule starting at the initial batch (a diagnostic): "
        f"{_f(s.get('geomean_ratio_to_limit_from_initial', math.nan))}",
        f"- runs reaching the target: {s['reached_share']:.0%} of {s['runs']}",
        f"- worst task: {s['worst_task']} ({_f(s['worst_task_ratio'])} x limit)",
        f"- run time: {_f(s.get('run_s_total', math.nan) / 60, 1)} min of one core over all runs",
    ]
    if s["limit_beaten"]:
        lines.append(
            f"- **LIMIT BEATEN in {len(s['limit_beaten'])} runs** (a planner bug): {s['limit_beaten']}"
        )
    lines += [
        "",
        "| task | seed | TTA min | reached | final metric | limit min | best static | best static min | x limit | x best static |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs.itertuples():
        tta = r.time_to_accuracy_s / 60 if r.reached_target else math.nan
        lines.append(
            f"| {r.task} | {r.seed} | {_f(tta, 1)} | {'yes' if r.reached_target else 'no'} | "
            f"{_f(float(r.final_metric), 4)} {r.metric} | {_f(r.limit_s / 60, 1)} | {r.best_static or '-'} | "
            f"{_f(r.best_static_s / 60, 1)} | {_f(r.ratio)} | {_f(r.x_best_static)} |"
        )
    return "\n".join(lines) + "\n"


def rebuild_index(root: Path) -> None:
    """``README.md`` with every label's scores per split, and one ratio plot per split."""
    summaries = [json.loads(p.read_text()) for p in sorted(root.glob("*/*/summary.json"))]
    if not summaries:
        return
    lines = [
        "# dynamix-bench-v1: scores",
        "",
        "Rebuilt by `python -m experiments.benchmark` after each scoring; each label's table and command",
        "are in `<label>/<split>/summary.md`. Ratio: time to accuracy (a missed target counts its budget)",
        "over the hindsight limit's, geometric mean over every task and seed of the split.",
        "",
        "The column *x limit from initial batch* is a diagnostic beside it: time over the best schedule",
        "that starts at the workload's initial batch, as every adaptive controller must (on NCF the",
        "limit is a static batch that ran its first interval at itself).",
        "",
        "| split | controller | x limit (geomean) | x best static (geomean) | x limit from initial batch | reached | worst task (x limit) | limit beaten |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in sorted(summaries, key=lambda s: (s["split"], s["geomean_ratio_to_limit"])):
        lines.append(
            f"| {s['split']} | {s['label']} | {_f(s['geomean_ratio_to_limit'])} | "
            f"{_f(s['geomean_ratio_to_best_static'])} | {_f(s.get('geomean_ratio_to_limit_from_initial', math.nan))} | "
            f"{s['reached_share']:.0%} | "
            f"{s['worst_task']} ({_f(s['worst_task_ratio'])}) | {len(s['limit_beaten'])} |"
        )
    lines += [
        "",
        "Regenerate (the limit first, then the static grid; every other label is scored against both):",
        "",
    ]
    rank = {LIMIT_LABEL: 0, STATIC_LABEL: 1}
    ordered = sorted(summaries, key=lambda s: (rank.get(s["label"], 2), s["label"], s["split"]))
    lines += [f"    {s['command']}" for s in ordered if s.get("command")]
    atomic_write_text(root / "README.md", "\n".join(lines) + "\n")
    for split in sorted({s["split"] for s in summaries}):
        ratio_plot([s for s in summaries if s["split"] == split], root / f"{split}_ratios.png")


def ratio_plot(summaries: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    tasks = sorted({t for s in summaries for t in s["per_task_ratio"]})
    fig = Figure(figsize=(max(8.0, 0.9 * len(tasks)), 4.5))
    ax = fig.add_subplot()
    width = 0.8 / max(len(summaries), 1)
    for i, s in enumerate(summaries):
        y = [s["per_task_ratio"].get(t, math.nan) for t in tasks]
        ax.bar(np.arange(len(tasks)) + i * width, y, width, label=s["label"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2, tasks, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("TTA / hindsight limit (geomean over seeds)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)


@hydra.main(version_base=None, config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> Any:
    if cfg.task is not None:
        return run_task(cfg, Path(HydraConfig.get().runtime.output_dir))
    return orchestrate(cfg)["geomean_ratio_to_limit"]


if __name__ == "__main__":
    main()
