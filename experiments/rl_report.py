"""Does RL earn its place? PPO after the imitation warm start against the warm start alone and PPO
from scratch, over training seeds, on the batched simulator.

    python -m experiments.rl_report                          # conf/rl_report.yaml's arms and runs

Reads, per run of each arm, the training run's ``train_summary.json`` (its validation history:
every ``eval_every`` steps the geometric mean over held-out seeds of the benchmark's train-split
tasks of the time to accuracy; step 0 is the starting policy) and the benchmark's train-split
summary of the run's kept bundle (``python -m experiments.benchmark ... split=train``), and writes
into ``out_dir``:

* ``curves.csv``: one row per run and validation point (arm, run, seed, steps, minutes, per task);
* ``curves.png``: validation against PPO steps, one colour per arm, one line per seed;
* ``README.md``: per run its train-split score (x the hindsight limit) and worst task, per arm the
  mean, the spread (max - min) over seeds and the verdict against the warm start, and the test
  split of the kept bundle alone (scored once, after the choice).

A run stopped by hand after its last validation within the arm's budget (``max_steps``; the
machine's load, not the run, set when) has no ``train_summary.json``: its history is read from the
validation scalars of its TensorBoard log (``eval/tta_min_*``), the points up to ``max_steps``.

Run folders (``runs/``) are not committed: each run's summary is copied into ``out_dir/runs/`` and
each benchmark summary into ``out_dir/bench/``, and read from there when the folders are absent (both
committed). A run with neither its folder nor a copy (the copies were once left out of git) is read
back from the committed ``curves.csv``, which holds every validation point of every run.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from experiments.common import atomic_write_text
from experiments.reports.markdown import table

log = logging.getLogger(__name__)


def _copied(src: Path, dst: Path) -> Path:
    """``src`` copied to ``dst`` when it exists (a fresh run), else ``dst`` (the committed copy)."""
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
    if not dst.is_file():
        raise FileNotFoundError(f"neither {src} nor its committed copy {dst} exists: run it first")
    return dst


def history_from_tensorboard(run_dir: Path, max_steps: int) -> dict[str, Any]:
    """A run's validation history (as ``train_summary.json`` has it) from its TensorBoard log: the
    ``eval/tta_min_<task>`` scalars up to ``max_steps`` (the starting policy's validation, taken
    before PPO's logger exists, is not among them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, dict[str, float]] = {}
    for events in sorted((run_dir / "tb").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag.startswith("eval/tta_min_") and tag != "eval/tta_min_mean":
                for e in acc.Scalars(tag):
                    if e.step <= max_steps:
                        points.setdefault(int(e.step), {})[tag[len("eval/tta_min_") :]] = 60.0 * e.value
    if not points:
        raise FileNotFoundError(
            f"{run_dir} has neither train_summary.json nor validation scalars: run it first"
        )
    history = [{"timesteps": t, "tta_s": tta, "mean_tta_s": float(np.exp(np.mean(np.log(list(tta.values())))))}
               for t, tta in sorted(points.items())]  # fmt: skip
    return {"history": history, "timesteps": history[-1]["timesteps"], "stopped_after_steps": max_steps}


def history_from_curves(curves: Path, label: str) -> dict[str, Any] | None:
    """A run's validation history as the committed ``curves.csv`` holds it (one row per validation
    point), or ``None`` when the file has no row for ``label``: the fallback for a run whose folder
    and summary copy are both gone (copies written before ``out_dir/runs/`` was kept in git)."""
    if not curves.is_file():
        return None
    with curves.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["run"] == label]
    if not rows:
        return None
    history = []
    for r in sorted(rows, key=lambda r: int(r["steps"])):
        tta = {k[: -len("_min")]: 60.0 * float(v) for k, v in r.items()
               if k.endswith("_min") and k != "validation_min" and v != ""}  # fmt: skip
        history.append(
            {"timesteps": int(r["steps"]), "tta_s": tta, "mean_tta_s": 60.0 * float(r["validation_min"])}
        )
    return {"history": history, "timesteps": history[-1]["timesteps"], "from": "curves.csv"}


def load_arm_runs(cfg: DictConfig, out: Path) -> list[dict[str, Any]]:
    """Every run of every arm: its validation history and its train-split (and test-split) summary."""
    bench_root = Path(to_absolute_path(str(cfg.benchmark_root)))
    runs = []
    for arm in cfg.arms:
        for run in arm.runs:
            label = str(run.label)
            rec: dict[str, Any] = {"arm": str(arm.name), "label": label, "seed": int(run.seed)}
            if run.get("run_dir"):
                run_dir = Path(to_absolute_path(str(run.run_dir)))
                src, dst = run_dir / "train_summary.json", out / "runs" / f"{label}.json"
                history = None
                if run.get("max_steps") and not src.is_file() and (run_dir / "tb").is_dir():
                    history = history_from_tensorboard(run_dir, int(run.max_steps))
                elif not src.is_file() and not dst.is_file():
                    history = history_from_curves(out / "curves.csv", label)
                if history is not None:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write_text(dst, json.dumps(history, indent=1) + "\n")
                rec["run"] = json.loads(_copied(src, dst).read_text())
            for split in ("train", "test"):
                src = bench_root / label / split / "summary.json"
                dst = out / "bench" / label / split / "summary.json"
                if split == "test" and not src.is_file() and not dst.is_file():
                    continue  # the test split is scored for the kept bundle alone
                rec[split] = json.loads(_copied(src, dst).read_text())
            runs.append(rec)
    return runs


def curve_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in runs:
        for point in r.get("run", {}).get("history", []):
            row = {"arm": r["arm"], "run": r["label"], "seed": r["seed"], "steps": point["timesteps"],
                   "validation_min": point["mean_tta_s"] / 60}  # fmt: skip
            row.update({f"{task}_min": t / 60 for task, t in point["tta_s"].items()})
            rows.append(row)
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def plot(rows: list[dict[str, Any]], arms: list[str], out: Path, relative: list[str]) -> None:
    """Left: every arm's validation (log scale). Right: the ``relative`` arms' runs' validation over
    their first point (a fine-tuned run's is the starting policy's), where small moves show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rel) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    span = 5.0  # the right panel's +- range (%), widened to the largest move shown
    for k, arm in enumerate(arms):
        runs = sorted({r["run"] for r in rows if r["arm"] == arm})
        for j, run in enumerate(runs):
            pts = sorted((r["steps"], r["validation_min"]) for r in rows if r["run"] == run)
            if len(pts) < 2:
                continue
            x, y = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
            style = dict(
                color=colours[k % len(colours)], marker=".", alpha=0.85, label=arm if j == 0 else None
            )
            ax.plot(x / 1e6, y, **style)
            if arm in relative:
                moved = 100.0 * (y / y[0] - 1.0)
                rel.plot(x / 1e6, moved, **style)
                span = max(span, float(np.ceil(np.abs(moved).max() * 1.1)))
    ax.set_ylabel("validation: geomean time to accuracy (min)")
    ax.set_yscale("log")
    rel.set_ylabel("validation against the run's first point (%)")
    rel.axhline(0.0, color="grey", lw=0.8)
    rel.set_ylim(-span, span)
    for a in (ax, rel):
        a.set_xlabel("PPO steps (millions)")
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def arm_stats(runs: list[dict[str, Any]], arm: str) -> dict[str, float]:
    scores = [r["train"]["geomean_ratio_to_limit"] for r in runs if r["arm"] == arm and "train" in r]
    worst = [r["train"]["worst_task_ratio"] for r in runs if r["arm"] == arm and "train" in r]
    reached = [r["train"].get("reached_share", math.nan) for r in runs if r["arm"] == arm and "train" in r]
    return {
        "n": len(scores),
        "mean": float(np.mean(scores)),
        "min": float(np.min(scores)),
        "max": float(np.max(scores)),
        "spread": float(np.max(scores) - np.min(scores)),
        "worst_task_max": float(np.max(worst)),
        "reached_min": float(np.min(reached)),
    }


def render(cfg: DictConfig, runs: list[dict[str, Any]]) -> str:
    arms = [str(a.name) for a in cfg.arms]
    stats = {a: arm_stats(runs, a) for a in arms}
    base = stats[str(cfg.baseline_arm)]["mean"]
    run_rows = []
    for r in runs:
        hist = r.get("run", {}).get("history", [])
        start = f"{hist[0]['mean_tta_s'] / 60:.2f} ({hist[0]['timesteps']:,})" if hist else "-"
        best = f"{min(h['mean_tta_s'] for h in hist) / 60:.2f}" if hist else "-"
        train = r["train"]
        run_rows.append([r["arm"], r["label"], r["seed"], f"{r.get('run', {}).get('timesteps', 0):,}",
                         start, best, f"{train['geomean_ratio_to_limit']:.3f}",
                         f"{train['worst_task']} {train['worst_task_ratio']:.2f}x"])  # fmt: skip
    arm_rows = []
    for a in arms:
        s = stats[a]
        gain = base - s["mean"]
        if a == str(cfg.baseline_arm):
            verdict = "the baseline"
        elif gain > s["spread"]:
            verdict = f"ahead by {gain:.3f} > its spread"
        elif -gain > s["spread"]:
            verdict = f"behind by {-gain:.3f} > its spread"
        else:
            verdict = f"within its spread ({-gain:+.3f} against the baseline)"
        arm_rows.append([a, s["n"], f"{s['mean']:.3f}", f"{s['min']:.3f} - {s['max']:.3f}", f"{s['spread']:.3f}",
                         f"{s['worst_task_max']:.2f}", f"{s['reached_min']:.0%}", verdict])  # fmt: skip
    lines = [
        "# Reinforcement learning after the warm start (issue 39, section 3)",
        "",
        f"Regenerate: `python -m experiments.rl_report` after the runs below ({len(runs)} runs; commands in "
        "`conf/rl_report.yaml`).",
        "",
        *[f"- {n}" for n in cfg.notes],
        "",
        "## Arms on the benchmark's train split (geometric mean of TTA / hindsight limit; picks bundles)",
        "",
        *table(
            ["arm", "seeds", "mean", "range", "spread", "worst task (max)", "reached (min)", "verdict"],
            arm_rows,
        ),
        "",
        "## Runs",
        "",
        "Validation: the geometric mean over held-out seeds of every train-split task of the time to "
        "accuracy (min), first (at its step) and best; a fine-tuned policy's first validation during the critic "
        "warm-up is the starting policy's. The train-split score is the kept (best-validation) bundle's.",
        "",
        *table(
            [
                "arm",
                "run",
                "seed",
                "PPO steps",
                "first validation (step)",
                "best validation",
                "train x limit",
                "worst task",
            ],
            run_rows,
        ),
        "",
        "![learning curves](curves.png)",
        "",
        "## The arms",
        "",
        *[f"- `{a.name}`: {a.description}" for a in cfg.arms],
        *[f"  - `{r.label}`: `{r.command}`" for a in cfg.arms for r in a.runs],
    ]
    tested = [r for r in runs if "test" in r]
    if tested:
        lines += ["", "## Test split (scored once, for the bundle kept by the train split)", ""]
        lines += table(
            ["run", "test x limit", "reached", "worst task"],
            [[r["label"], f"{r['test']['geomean_ratio_to_limit']:.3f}", f"{r['test']['reached_share']:.0%}",
              f"{r['test']['worst_task']} {r['test']['worst_task_ratio']:.2f}x"] for r in tested],
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def rl_report_app(cfg: DictConfig) -> dict[str, Any]:
    out = Path(to_absolute_path(str(cfg.out_dir)))
    out.mkdir(parents=True, exist_ok=True)
    runs = load_arm_runs(cfg, out)
    rows = curve_rows(runs)
    write_csv(rows, out / "curves.csv")
    plot(rows, [str(a.name) for a in cfg.arms], out / "curves.png", [str(a) for a in cfg.relative_arms])
    atomic_write_text(out / "README.md", render(cfg, runs))
    summary = {str(a.name): arm_stats(runs, str(a.name)) for a in cfg.arms}
    atomic_write_text(out / "arms.json", json.dumps(summary, indent=1) + "\n")
    log.info("arms: %s", json.dumps(summary))
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="rl_report")
def main(cfg: DictConfig) -> None:
    OmegaConf.resolve(cfg)
    rl_report_app(cfg)


if __name__ == "__main__":
    main()
