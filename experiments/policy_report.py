"""The policy library's report: learning curves and the ablation of the universal policy's training.

    python -m experiments.policy_report                          # conf/policy_report.yaml's runs

Reads each training run's ``train_summary.json`` (``python -m experiments.train``; its validation
history: every ``eval_every`` steps the geometric mean over the validation tasks of the time to
accuracy, the warm start at step 0) and writes ``results/policies/README.md`` with

* per run: the warm start's validation, the best and the final one, and whether RL improved on the
  warm start (the best entry after step 0 below the step-0 entry);
* per validation task: the best bundle's time beside the warm start's;
* ``learning_curve.png``: validation against training steps, every run.

Run folders (``runs/``) are not committed: a run whose folder is absent is read from the
``runs.json`` an earlier report wrote beside the README (validation history, steps, training time).

The validation tasks are held-out seeds of the benchmark's *train* split: the test split is for
``experiments.benchmark`` alone.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from experiments.common import atomic_write_text
from experiments.reports.markdown import table

log = logging.getLogger(__name__)

RUN_COLUMNS = [
    "run",
    "PPO steps",
    "wall min",
    "warm start (min)",
    "best (min)",
    "final (min)",
    "RL beat the warm start",
]


def load_run(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "train_summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: train the run first (python -m experiments.train)")
    summary = json.loads(path.read_text())
    history = summary.get("history") or []
    if not history:
        raise ValueError(f"{path} has no validation history")
    return summary


def curve(summary: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(timesteps, validation score) in history order; the score is what training selected on."""
    h = summary["history"]
    return np.array([e["timesteps"] for e in h], float), np.array([e["mean_tta_s"] for e in h], float)


def run_row(label: str, summary: dict[str, Any], minutes: float | None) -> list[Any]:
    steps, score = curve(summary)
    warm = score[0] if steps[0] == 0 else math.nan
    later = score[steps > 0]
    best_i = int(np.argmin(score))
    improved = bool(later.size and math.isfinite(warm) and later.min() < warm)
    return [
        label,
        f"{summary['timesteps']:,}",
        "-" if minutes is None else f"{minutes:.0f}",
        "-" if not math.isfinite(warm) else f"{warm / 60:.2f}",
        f"{score[best_i] / 60:.2f} (step {int(steps[best_i]):,})",
        f"{score[-1] / 60:.2f}",
        "- (no warm start)"
        if not math.isfinite(warm)
        else ("- (no PPO)" if not later.size else ("yes" if improved else "**no**")),
    ]


def plot(runs: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, summary in runs.items():
        steps, score = curve(summary)
        ax.plot(steps / 1e6, score / 60, marker="o", label=label)
    ax.set_xlabel("PPO steps (millions; 0 = the warm start)")
    ax.set_ylabel("validation TTA, geometric mean (min)")
    ax.set_title("Held-out train-split tasks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def render(cfg: DictConfig, runs: dict[str, dict[str, Any]], minutes: dict[str, float | None]) -> str:
    rows = [run_row(label, s, minutes[label]) for label, s in runs.items()]
    main_label = next(iter(runs))
    main = runs[main_label]
    h = main["history"]
    best = min(h, key=lambda e: e["mean_tta_s"])
    tasks = sorted(best["tta_s"])
    task_rows = [[t, f"{h[0]['tta_s'][t] / 60:.2f}", f"{best['tta_s'][t] / 60:.2f}",
                  f"{best['tta_s'][t] / h[0]['tta_s'][t]:.3f}"] for t in tasks]  # fmt: skip
    lines = [
        "# The policy library",
        "",
        "Regenerate: `python -m experiments.policy_report` after the training runs below "
        "(each `python -m experiments.train ...`, commands in `conf/policy_report.yaml`).",
        "",
        f"- `universal/`: {cfg.runs[main_label].description}",
        f"  Trained by `{cfg.runs[main_label].command}`.",
        "- Validation: every `eval_every` steps, the geometric mean over held-out seeds of benchmark train-split "
        "tasks of the time to accuracy (a missed target counts twice the episode); the best validation is "
        "the bundle kept. The test split is scored by `experiments.benchmark` alone.",
        *[f"- {note}" for note in cfg.get("notes", [])],
        "",
        "## Runs (learning curve: `learning_curve.png`)",
        "",
        *table(RUN_COLUMNS, rows),
        "",
        "![learning curves](learning_curve.png)",
        "",
        f"## `{main_label}` per validation task (warm start vs the kept bundle)",
        "",
        *table(["task", "warm start (min)", "kept (min)", "ratio"], task_rows),
        "",
        *benchmark_lines(cfg),
        *ablation_lines(cfg),
        "## What the runs differ in",
        "",
        *[f"- `{label}`: {cfg.runs[label].description} (`{cfg.runs[label].command}`)" for label in runs],
        "",
    ]
    return "\n".join(lines)


def benchmark_lines(cfg: DictConfig) -> list[str]:
    """The kept bundle's scores on dynamix-bench-v1 (``experiments.benchmark``'s summary.json per
    split under ``benchmark_root/benchmark_label``), beside the labels of ``compare``."""
    root = Path(to_absolute_path(str(cfg.benchmark_root)))
    rows = []
    for label in [str(cfg.benchmark_label), *map(str, cfg.compare)]:
        cells = [label]
        for split in ("test", "train"):
            f = root / label / split / "summary.json"
            s = json.loads(f.read_text()) if f.exists() else {}
            cells += [
                f"{s['geomean_ratio_to_limit']:.3f}" if s else "-",
                f"{100 * s['reached_share']:.0f}%" if s else "-",
            ]
        rows.append(cells)
    return [
        f"## On dynamix-bench-v1, zero-shot (`{cfg.benchmark_label}`; `results/benchmark/README.md`)",
        "",
        *table(["label", "test x limit", "test reached", "train x limit", "train reached"], rows),
        "",
        "Bundles were compared on the train split only; the test split scored the kept one.",
        "",
    ]


def ablation_lines(cfg: DictConfig) -> list[str]:
    """The ablation table (``cfg.ablation``): one row per component tried, its benchmark train-split
    score read from the ``summary`` it names (an ``experiments.benchmark`` summary.json) where one
    is committed, else the one recorded in the config (from that run's benchmark output)."""
    entries = list(cfg.get("ablation") or [])
    if not entries:
        return []
    rows = []
    for e in entries:
        score = e.get("train_x_limit")
        if e.get("summary"):
            f = Path(to_absolute_path(str(e.summary)))
            score = json.loads(f.read_text())["geomean_ratio_to_limit"]
        rows.append([str(e.component), str(e.variant), "-" if score is None else f"{float(score):.3f}",
                     str(e.get("run") or "-"), str(e.verdict)])  # fmt: skip
    return [
        "## Ablation (benchmark train split, geometric mean of TTA / hindsight limit)",
        "",
        str(cfg.get("ablation_header", "")),
        "",
        *table(["component", "variant", "train x limit", "run", "verdict"], rows),
        "",
    ]


def committed_runs(out: Path) -> dict[str, dict[str, Any]]:
    """The runs recorded by an earlier report (``out/runs.json``): run folders are not committed, so
    a fresh checkout re-renders the report of runs trained elsewhere from this record."""
    path = out / "runs.json"
    return json.loads(path.read_text()) if path.exists() else {}


def policy_report_app(cfg: DictConfig) -> dict[str, Any]:
    out = Path(to_absolute_path(str(cfg.out_dir)))
    recorded = committed_runs(out)
    runs, minutes = {}, {}
    for label, spec in cfg.runs.items():
        run_dir = Path(to_absolute_path(str(spec.run_dir)))
        if not (run_dir / "train_summary.json").exists() and label in recorded:
            log.info(
                "%s: %s is absent; its validation history is read from %s", label, run_dir, out / "runs.json"
            )
            runs[label] = recorded[label]
        else:
            runs[label] = load_run(run_dir)
        secs = runs[label].get("train_seconds")
        minutes[label] = None if secs is None else float(secs) / 60
    out.mkdir(parents=True, exist_ok=True)
    plot(runs, out / "learning_curve.png")
    atomic_write_text(out / "README.md", render(cfg, runs, minutes))
    summary = {
        label: {k: s[k] for k in ("history", "timesteps", "train_seconds") if k in s}
        for label, s in runs.items()
    }
    atomic_write_text(out / "runs.json", json.dumps(summary, indent=1) + "\n")
    return summary


@hydra.main(version_base="1.3", config_path="../conf", config_name="policy_report")
def main(cfg: DictConfig) -> None:
    policy_report_app(cfg)


if __name__ == "__main__":
    main()
