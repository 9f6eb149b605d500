"""The headline report: checks the PPO bundle against every target, row by row, from the tables.

    python -m experiments.headline_report

Reads the aggregated tables of the three headline sweeps (``results/headline/8_workers``,
``results/headline/scale`` and ``results/headline/transfer_imagenet``, each written by
``experiments.aggregate``) and writes ``results/headline/README.md``: every target of the
headline, met or not, with the figures beside the oracle's (the physical limit in simulation).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import hydra
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from experiments.common import atomic_write_text

DYNAMIC = ("throttle", "interference", "mixed")
BASELINES = ("dlb", "omnilearn", "pollux", "rex")


def _row(t: pd.DataFrame, controller: str) -> pd.Series | None:
    hit = t[t["controller"] == controller]
    return hit.iloc[0] if len(hit) else None


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if x is not None and math.isfinite(x) else "—"


def _mark(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**not met**")


def check_scenarios(table: pd.DataFrame) -> tuple[list[str], list[dict]]:
    """Markdown rows and machine-readable checks for the 8-worker headline table."""
    lines = [
        "| scenario | PPO TTA (min) | oracle | best baseline | best static | PPO/oracle (≤ 1.05) "
        "| PPO ≤ best baseline | final acc ≥ best static's | PPO/REX (≤ 0.9, dynamic) "
        "| PPO/best static (oracle's) (≤ 0.5 where oracle ≤ 0.5) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks = []
    for scenario, t in table.groupby("scenario", sort=False):
        ppo, oracle, rex = _row(t, "ppo"), _row(t, "oracle"), _row(t, "rex")
        if ppo is None:
            continue
        base = t[t["controller"].isin(BASELINES) & (t["reach_fraction"] == 1.0)]
        best_base = base.loc[base["tta_min_mean"].idxmin()] if len(base) else None
        static = _row(t, str(t["best_static"].iloc[0]))
        r_oracle = ppo["tta_min_mean"] / oracle["tta_min_mean"] if oracle is not None else math.nan
        ok_oracle = r_oracle <= 1.05 and ppo["reach_fraction"] == 1.0
        ok_base = best_base is None or ppo["tta_min_mean"] <= best_base["tta_min_mean"]
        ok_acc = static is None or ppo["final_accuracy_mean"] >= static["final_accuracy_mean"]
        r_rex = ppo["tta_min_mean"] / rex["tta_min_mean"] if rex is not None else math.nan
        ok_rex = (r_rex <= 0.9) if scenario in DYNAMIC else None
        r_static = ppo["tta_vs_best_static"]
        o_static = oracle["tta_vs_best_static"] if oracle is not None else math.nan
        ok_half = (r_static <= 0.5) if o_static <= 0.5 else None
        base_txt = (
            f"{best_base['controller']} {_fmt(best_base['tta_min_mean'])}" if best_base is not None else "—"
        )
        static_txt = f"{static['controller']} {_fmt(static['tta_min_mean'])}" if static is not None else "—"
        lines.append(
            f"| {scenario} | {_fmt(ppo['tta_min_mean'])} ± {_fmt(ppo['tta_min_ci95'])} "
            f"| {_fmt(oracle['tta_min_mean']) if oracle is not None else '—'} | {base_txt} | {static_txt} "
            f"| {_fmt(r_oracle, 3)} {_mark(ok_oracle)} | {_mark(ok_base)} "
            f"| {_fmt(ppo['final_accuracy_mean'], 4)} vs {_fmt(static['final_accuracy_mean'], 4) if static is not None else '—'} {_mark(ok_acc)} "
            f"| {_fmt(r_rex, 3)} {_mark(ok_rex)} | {_fmt(r_static, 3)} ({_fmt(o_static, 3)}) {_mark(ok_half)} |"
        )
        checks.append(
            {
                "scenario": scenario,
                "ppo_tta_min": float(ppo["tta_min_mean"]),
                "oracle_tta_min": float(oracle["tta_min_mean"]) if oracle is not None else None,
                "ppo_vs_oracle": float(r_oracle),
                "within_1_05_oracle": bool(ok_oracle),
                "no_worse_than_best_baseline": bool(ok_base),
                "best_baseline": None if best_base is None else str(best_base["controller"]),
                "final_acc_ge_best_static": bool(ok_acc),
                "ppo_vs_rex": float(r_rex),
                "le_0_9_rex": ok_rex,
                "ppo_vs_best_static": float(r_static),
                "oracle_vs_best_static": float(o_static),
                "le_0_5_best_static": ok_half,
            }
        )
    return lines, checks


def check_scale(table: pd.DataFrame) -> tuple[list[str], list[dict]]:
    lines = [
        "| cluster | scenario | PPO TTA (min) | best static | PPO/best static (< 1) | oracle/best static | PPO/oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    checks = []
    for (cluster, scenario), t in table.groupby(["cluster", "scenario"], sort=False):
        ppo, oracle = _row(t, "ppo"), _row(t, "oracle")
        static = _row(t, str(t["best_static"].iloc[0]))
        if ppo is None or static is None:
            continue
        ok = ppo["reach_fraction"] == 1.0 and ppo["tta_vs_best_static"] < 1.0
        lines.append(
            f"| {cluster} | {scenario} | {_fmt(ppo['tta_min_mean'])} | {static['controller']} {_fmt(static['tta_min_mean'])} "
            f"| {_fmt(ppo['tta_vs_best_static'], 3)} {_mark(ok)} "
            f"| {_fmt(oracle['tta_vs_best_static'], 3) if oracle is not None else '—'} | {_fmt(ppo['tta_vs_oracle'], 3)} |"
        )
        checks.append(
            {
                "cluster": cluster,
                "scenario": scenario,
                "ppo_vs_best_static": float(ppo["tta_vs_best_static"]),
                "beats_best_static": bool(ok),
                "ppo_vs_oracle": float(ppo["tta_vs_oracle"]),
            }
        )
    return lines, checks


def benchmark_lines(bench: Path, label: str = "ppo-headline") -> list[str]:
    """The bundle's dynamix-bench-v1 scores against the hindsight limit, where they have been run."""
    lines = []
    for split in ("test", "train"):
        path = bench / label / split / "summary.json"
        if not path.is_file():
            continue
        s = json.loads(path.read_text())
        oracle = bench / "oracle" / split / "summary.json"
        o = json.loads(oracle.read_text()) if oracle.is_file() else {}
        lines.append(
            f"| {split} | {s['runs']} | {_fmt(s['geomean_ratio_to_limit'], 3)} | "
            f"{_fmt(s['geomean_ratio_to_best_static'], 3)} | {s['reached_share']:.0%} | "
            f"{s['worst_task']} ({_fmt(s['worst_task_ratio'], 1)}) | {_fmt(o.get('geomean_ratio_to_limit', math.nan), 3)} |"
        )
    if not lines:
        return []
    return [
        "## Against the hindsight limit: dynamix-bench-v1 (`results/benchmark`)",
        "",
        f"    python -m experiments.benchmark controller=ppo controller.path=results/headline/policy label={label} split=test",
        "",
        "| split | runs | PPO x limit (geomean) | PPO x best static | reached | worst task (x limit) | greedy oracle x limit |",
        "|---|---|---|---|---|---|---|",
        *lines,
        "",
    ]


def report(cfg: DictConfig) -> dict:
    root = Path(to_absolute_path(cfg.root))
    main = pd.read_csv(root / "8_workers" / "table.csv")
    lines = [
        "```bash",
        *cfg.commands,
        "```",
        "",
        "# Headline: the pretrained PPO bundle against every baseline",
        "",
        "Bundle: `results/headline/policy` (per-worker shared policy; trained on randomised 4-8 worker "
        "T4/V100(/RTX2080Ti) clusters running ResNet-18 / CIFAR-10, fault families with random "
        "intensities; never on the evaluation presets or seeds). Evaluation: held-out seeds 0-4 on the "
        "five scenario presets. TTA = time to 93% validation accuracy, minutes of simulated wall-clock "
        "time, mean ± 95% t-interval half-width. The greedy oracle (ground-truth goodput, simulation "
        "only) is the imitation teacher, not a limit: the tables below read PPO against it as issue 5 "
        "set out; the limit is the benchmark's hindsight planner (next section).",
        "",
        *benchmark_lines(root.parent / "benchmark"),
        "## Targets, 8 workers (default T4/V100 cluster)",
        "",
    ]
    rows, checks = check_scenarios(main)
    lines += rows
    out: dict = {"scenarios": checks}
    for name, title in (("scale", "Cluster sizes it was not trained on (16 and 32 workers)"),):
        path = root / name / "table.csv"
        if path.is_file():
            rows, c = check_scale(pd.read_csv(path))
            lines += ["", f"## {title}", "", *rows]
            out[name] = c
    path = root / "transfer_imagenet" / "table.csv"
    if path.is_file():
        t = pd.read_csv(path)
        lines += [
            "",
            "## Transfer: trained on ResNet-18 / CIFAR-10, evaluated on ResNet-50 / ImageNet (target 74%)",
            "",
            "| scenario | controller | TTA (min) | reached | ×best static | ×oracle |",
            "|---|---|---|---|---|---|",
        ]
        for _, r in t.iterrows():
            lines.append(
                f"| {r['scenario']} | {r['controller']} | {_fmt(r['tta_min_mean'], 1)} | {r['reached']}/{r['runs']} "
                f"| {_fmt(r['tta_vs_best_static'], 3)} | {_fmt(r['tta_vs_oracle'], 3)} |"
            )
        out["transfer"] = t[
            ["scenario", "controller", "tta_min_mean", "tta_vs_best_static", "tta_vs_oracle"]
        ].to_dict("records")
    lines += ["", "Full tables, plots and per-run CSVs: `8_workers/`, `scale/`, `transfer_imagenet/`.", ""]
    atomic_write_text(root / "README.md", "\n".join(lines))
    atomic_write_text(root / "targets.json", json.dumps(out, indent=2, default=float) + "\n")
    print("\n".join(lines))
    return out


@hydra.main(version_base=None, config_path="../conf", config_name="headline_report")
def main(cfg: DictConfig) -> None:
    report(cfg)


if __name__ == "__main__":
    main()
