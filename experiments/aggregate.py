"""Turn an evaluation sweep into a table and plots.

    python -m experiments.aggregate sweep_dir=multirun/baselines out=results/baselines

Reads every ``summary.csv`` under ``sweep_dir`` (written by :mod:`experiments.evaluate`) and
writes into ``out``:

* ``table.md``: per scenario x controller, over seeds: time to accuracy in minutes (mean and 95%
  t-interval), fraction of seeds reaching the target, final accuracy, mean idle fraction,
  resource inefficiency (idle GPU-seconds per busy GPU-second), batch changes, decision time,
  and time to accuracy relative to the best static batch and to the oracle. It starts with the
  commands that regenerate it (read back from the runs' ``.hydra/overrides.yaml``);
* ``table.csv``: the same numbers, unrounded; ``summary.csv``: every run's summary row;
* ``accuracy_vs_time.png``, ``batch_trajectories.png``, ``time_to_accuracy.png``,
  ``idle_fraction.png`` (see :mod:`experiments.reports.plots`).

Time-to-accuracy statistics are over the seeds that reached the target (a missed run has no time
to accuracy; its seed shows in the ``reached`` column and marks the row with a dagger). The best
static batch of a scenario is the ``static-<batch>`` controller with the lowest mean score over
its seeds, as the benchmark picks it (:mod:`dynamix_gym.benchmark.scoring`: a run's time to
accuracy, or its time budget where it missed the target).
"""

from __future__ import annotations

import logging
import math
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
import numpy as np
import pandas as pd
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig
from scipy import stats

from dynamix_gym.benchmark import scoring
from experiments.common import atomic_write_text
from experiments.evaluate import COLUMNS
from experiments.reports import plots
from sim.faults import SCENARIOS

log = logging.getLogger(__name__)

#: A run is identified by these; a repeated run (same dir reused, grid rerun) counts once (the last).
RUN_KEYS = ["backend", "workload", "cluster", "scenario", "controller", "seed"]
#: One table per context; rows within it are scenario x controller.
CONTEXT_KEYS = ["backend", "workload", "cluster"]
GROUP_KEYS = [*CONTEXT_KEYS, "scenario", "controller"]
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
STATIC = re.compile(r"^static-(\d+)$")
ORACLE = "oracle"

#: Aggregated columns (table.csv), in order.
TABLE_COLUMNS = [
    *GROUP_KEYS,
    "runs",
    "reached",
    "reach_fraction",
    "tta_min_mean",
    "tta_min_ci95",
    "tta_min_ci_low",
    "tta_min_ci_high",
    "final_accuracy_mean",
    "metric",
    "final_metric_mean",
    "idle_fraction_mean",
    "resource_inefficiency_mean",
    "batch_changes_mean",
    "decision_time_ms_mean",
    "best_static",
    "tta_vs_best_static",
    "tta_vs_oracle",
]


# --- reading a sweep -------------------------------------------------------------------------------
def with_metric_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Summary rows written before workloads named their metric: their metric is the accuracy."""
    if "metric" in df.columns or "final_accuracy" not in df.columns:
        return df
    df = df.assign(metric="accuracy", final_metric=df["final_accuracy"])
    return df.assign(target_metric=df["target_accuracy"]) if "target_accuracy" in df.columns else df


def with_policy_count(df: pd.DataFrame) -> pd.DataFrame:
    """Summary rows written before the count of decisions made without the policy: not recorded
    (NaN), except for a controller that decides in process, which never decides without it (0)."""
    if "decisions_without_policy" in df.columns or "controller" not in df.columns:
        return df
    remote = df["controller"].astype(str) == "arbitrator"
    return df.assign(decisions_without_policy=remote.map({True: float("nan"), False: 0.0}))


def load_runs(sweep_dir: str | Path) -> pd.DataFrame:
    """Every summary row under ``sweep_dir``, with the run's directory in ``run_dir``."""
    sweep_dir = Path(sweep_dir)
    frames = []
    for path in sorted(sweep_dir.rglob("summary.csv")):
        df = with_policy_count(with_metric_columns(pd.read_csv(path)))
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(
                f"{path} lacks the summary columns {missing}; was it written by experiments.evaluate?"
            )
        frames.append(df.assign(run_dir=str(path.parent)))
    if not frames:
        raise FileNotFoundError(
            f"no summary.csv under {sweep_dir}; run `python -m experiments.evaluate -m ...` first"
        )
    runs = pd.concat(frames, ignore_index=True)
    deduped = runs.drop_duplicates(RUN_KEYS, keep="last")
    if len(deduped) < len(runs):
        log.warning("%d repeated runs under %s counted once (the last)", len(runs) - len(deduped), sweep_dir)
    return deduped.reset_index(drop=True)


def sweep_commands(run_dirs: Sequence[str | Path], sweep_dir: str | Path) -> list[str]:
    """The ``experiments.evaluate`` commands that produce ``run_dirs`` into ``sweep_dir``.

    Read back from each run's ``.hydra/overrides.yaml`` (and its user config dir from
    ``.hydra/hydra.yaml``): runs overriding the same keys form one sweep, each key listing its
    values, when they make a full grid; otherwise each run gets its own command.
    """
    grids: dict[tuple, dict[str, list[str]]] = {}
    jobs: dict[tuple, list[tuple[str, ...]]] = {}
    for run_dir in dict.fromkeys(Path(d) for d in run_dirs):
        path = run_dir / ".hydra" / "overrides.yaml"
        if not path.exists():
            log.warning("%s has no .hydra/overrides.yaml; its command is not in the table", run_dir)
            continue
        pairs = [str(o).partition("=")[::2] for o in yaml.safe_load(path.read_text()) or []]
        pairs.sort(key=lambda kv: kv[0].lstrip("+~") != "experiment")  # the preset first, for the reader
        group = (_user_config_dirs(run_dir / ".hydra" / "hydra.yaml"), tuple(k for k, _ in pairs))
        grid = grids.setdefault(group, {k: [] for k, _ in pairs})
        for k, v in pairs:
            if v not in grid[k]:
                grid[k].append(v)
        jobs.setdefault(group, []).append(tuple(v for _, v in pairs))
    commands = []
    for (config_dirs, keys), grid in grids.items():
        full = len(set(jobs[config_dirs, keys])) == math.prod(len(v) for v in grid.values())
        listable = all(
            len(v) == 1 or not any(re.search(r"[,\[\]{}()'\"$]", x) for x in v) for v in grid.values()
        )
        if full and listable:
            args = [f"{k}={','.join(sorted(v, key=_value_order(k)))}" for k, v in grid.items()]
            commands.append(_evaluate_command(config_dirs, args, sweep_dir))
        else:  # one command per run
            for job in jobs[config_dirs, keys]:
                args = [f"{k}={v}" for k, v in zip(keys, job, strict=True)]
                commands.append(_evaluate_command(config_dirs, args, sweep_dir))
    return commands


def _evaluate_command(config_dirs: Sequence[str], overrides: Sequence[str], sweep_dir: str | Path) -> str:
    words = ["python", "-m", "experiments.evaluate", "-m"]
    for d in config_dirs:
        words += ["--config-dir", d]
    words += [*overrides, f"hydra.sweep.dir={sweep_dir}"]
    return " ".join(shlex.quote(w) for w in words)


def _user_config_dirs(hydra_yaml: Path) -> tuple[str, ...]:
    """Config dirs given with ``--config-dir`` (recorded by Hydra as command-line config sources)."""
    if not hydra_yaml.exists():
        return ()
    sources = (yaml.load(hydra_yaml.read_text(), Loader=_YAML_LOADER) or {}).get("hydra", {})
    sources = sources.get("runtime", {}).get("config_sources", [])
    return tuple(
        s["path"] for s in sources if s.get("provider") == "command-line" and s.get("schema") == "file"
    )


def _value_order(key: str):
    """Numbers numerically, scenarios in the presets' order, anything else by name."""

    def order(value: str) -> tuple:
        try:
            return (0, float(value), value)
        except ValueError:
            return (1, *scenario_order(value)) if key == "scenario" else (1, 0, value)

    return order


# --- statistics ------------------------------------------------------------------------------------
def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and the ``confidence`` Student-t interval of the mean (nan bounds for fewer than 2 values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    sem = float(stats.sem(x))
    if sem == 0.0:
        return mean, mean, mean
    lo, hi = stats.t.interval(confidence, x.size - 1, loc=mean, scale=sem)
    return mean, float(lo), float(hi)


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per context x scenario x controller (:data:`TABLE_COLUMNS`), scenarios in the
    presets' order, controllers in :func:`controller_order`."""
    runs = with_metric_columns(runs)
    rows = []
    for key, g in runs.groupby(GROUP_KEYS, sort=False):
        reached = g["reached_target"].astype(bool)
        mean, lo, hi = t_interval(g.loc[reached, "time_to_accuracy_s"].to_numpy() / 60.0)
        rows.append(
            {
                **dict(zip(GROUP_KEYS, key, strict=True)),
                "runs": len(g),
                "reached": int(reached.sum()),
                "reach_fraction": float(reached.mean()),
                "tta_min_mean": mean,
                "tta_min_ci95": (hi - lo) / 2.0,
                "tta_min_ci_low": lo,
                "tta_min_ci_high": hi,
                "final_accuracy_mean": g["final_accuracy"].mean(),
                "metric": " ".join(dict.fromkeys(g["metric"].astype(str))),
                "final_metric_mean": g["final_metric"].mean(),
                "idle_fraction_mean": g["mean_idle_fraction"].mean(),
                "resource_inefficiency_mean": g["resource_inefficiency"].mean(),
                "batch_changes_mean": g["batch_changes"].mean(),
                "decision_time_ms_mean": g["decision_time_ms"].mean(),
            }
        )
    contexts = list(dict.fromkeys(tuple(r[k] for k in CONTEXT_KEYS) for r in rows))
    rows.sort(
        key=lambda r: (
            contexts.index(tuple(r[k] for k in CONTEXT_KEYS)),
            scenario_order(r["scenario"]),
            controller_order(r["controller"]),
        )
    )
    parts = []
    runs_of = dict(iter(runs.groupby([*CONTEXT_KEYS, "scenario"], sort=False)))
    for key, t in pd.DataFrame(rows).groupby([*CONTEXT_KEYS, "scenario"], sort=False):
        best = best_static(runs_of[key])
        parts.append(
            t.assign(
                best_static=best,
                tta_vs_best_static=t["tta_min_mean"] / _tta_of(t, best),
                tta_vs_oracle=t["tta_min_mean"] / _tta_of(t, ORACLE),
            )
        )
    return pd.concat(parts, ignore_index=True)[TABLE_COLUMNS]


def best_static(runs: pd.DataFrame) -> str | None:
    """The static batch of one scenario's runs with the lowest mean score over its seeds (the
    benchmark's one rule, :func:`dynamix_gym.benchmark.scoring.best_static`: a missed target
    counts the time budget); None if no static batch reached the target in any seed."""
    static = runs[runs["controller"].astype(str).str.match(STATIC.pattern)]
    if static.empty or not static["reached_target"].astype(bool).any():
        return None
    return str(scoring.best_static(static.assign(_all=0), by=("_all",)).iloc[0])


def _tta_of(table: pd.DataFrame, controller: str | None) -> float:
    hit = table.loc[table["controller"] == controller, "tta_min_mean"]
    return float(hit.iloc[0]) if len(hit) else math.nan


def controller_order(name: str) -> tuple[int, float, str]:
    """Static batches by size, then the adaptive controllers by name, the oracle last."""
    m = STATIC.match(name)
    if m:
        return (0, float(m.group(1)), name)
    return (2, 0.0, name) if name == ORACLE else (1, 0.0, name)


def scenario_order(name: str) -> tuple[int, str]:
    """The presets' order (static_hetero, throttle, jitter, interference, mixed), then by name."""
    presets = list(SCENARIOS)
    return (presets.index(name), name) if name in presets else (len(presets), name)


# --- writing ---------------------------------------------------------------------------------------
def to_markdown(table: pd.DataFrame, commands: Sequence[str], title: str) -> str:
    lines = ["```bash", *commands, "```", "", f"# {title}", ""]
    lines += [
        "Time to accuracy (TTA) in minutes of wall-clock time: mean over the seeds that reached the "
        "target, with the half-width of its 95% Student-t interval (two-sided; none with one seed). "
        "`reached`: seeds reaching the target / seeds run († marks rows where some did not). "
        "Idle: mean fraction of an iteration a live worker waits at the barrier. Inefficiency: idle "
        "GPU-seconds per busy GPU-second. Changes: decisions that changed any local batch. "
        "Decision: controller time per decision. ×best static / ×oracle: mean TTA relative to the "
        "scenario's best static batch (lowest mean TTA among static batches reaching the target in "
        "every seed) and to the oracle.",
        "",
    ]
    for ctx, t in table.groupby(CONTEXT_KEYS, sort=False):
        metric = " ".join(dict.fromkeys(t["metric"].astype(str)))
        header = (
            f"| scenario | controller | TTA (min) | reached | final {metric} | idle | inefficiency | changes "
            "| decision (ms) | ×best static | ×oracle |"
        )
        lines += [f"## {' / '.join(str(c) for c in ctx)}", "", header, "|" + "---|" * 11]
        for _, r in t.iterrows():
            mark = " †" if r["reached"] < r["runs"] else ""
            best = " (best static)" if r["controller"] == r["best_static"] else ""
            lines.append(
                f"| {r['scenario']} | {r['controller']}{best} | {_pm(r['tta_min_mean'], r['tta_min_ci95'])} "
                f"| {r['reached']}/{r['runs']}{mark} | {r['final_metric_mean']:.4f} "
                f"| {r['idle_fraction_mean']:.1%} | {r['resource_inefficiency_mean']:.3f} "
                f"| {r['batch_changes_mean']:.1f} | {r['decision_time_ms_mean']:.3f} "
                f"| {_ratio(r['tta_vs_best_static'])} | {_ratio(r['tta_vs_oracle'])} |"
            )
        lines.append("")
    return "\n".join(lines)


def _pm(mean: float, half: float) -> str:
    if not math.isfinite(mean):
        return "—"
    return f"{mean:.1f} ± {half:.1f}" if math.isfinite(half) else f"{mean:.1f}"


def _ratio(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "—"


def aggregate(cfg: DictConfig) -> tuple[pd.DataFrame, list[Path]]:
    """Reads ``cfg.sweep_dir``, writes the table, CSVs and plots into ``cfg.out``; returns the table
    and the plots written."""
    sweep_dir = Path(to_absolute_path(cfg.sweep_dir))
    out = Path(to_absolute_path(cfg.out))
    runs = load_runs(sweep_dir)
    table = summarise(runs)
    commands = [*sweep_commands(runs["run_dir"], cfg.sweep_dir), aggregate_command(cfg)]
    title = cfg.get("title") or default_title(runs)
    atomic_write_text(out / "table.md", to_markdown(table, commands, title))
    atomic_write_text(out / "table.csv", table.to_csv(index=False))
    atomic_write_text(out / "summary.csv", runs[list(COLUMNS)].to_csv(index=False))
    contexts = list(table.groupby(CONTEXT_KEYS, sort=False).groups)
    written = []
    for ctx in contexts:
        # One set of figures per context (e.g. per cluster size of a sweep over cluster.workers).
        in_ctx = (runs[CONTEXT_KEYS] == pd.Series(dict(zip(CONTEXT_KEYS, ctx, strict=True)))).all(axis=1)
        t_ctx = (table[CONTEXT_KEYS] == pd.Series(dict(zip(CONTEXT_KEYS, ctx, strict=True)))).all(axis=1)
        written += plots.plot_sweep(
            runs[in_ctx],
            table[t_ctx],
            out if len(contexts) == 1 else out / "_".join(str(c) for c in ctx[1:]),
            seed=cfg.get("plot_seed"),
            scenario=cfg.get("trajectory_scenario"),
            controllers=cfg.get("trajectory_controllers"),
        )
    log.info("aggregated %d runs of %s into %s", len(runs), sweep_dir, out)
    return table, written


def console_summary(markdown: str, out: Path, plots: Sequence[Path]) -> str:
    """What a person reads at the console: ``table.md`` from its title on (without the commands
    block that opens it), then where the table, the CSVs and the plots are."""
    start = markdown.find("\n# ")
    lines = [markdown[start + 1 :].rstrip() if start >= 0 else markdown.rstrip(), ""]
    lines.append(f"Table: {out / 'table.md'} (and table.csv; every run's row: summary.csv)")
    lines += ["Plots:", *(f"  {p}" for p in plots)]
    return "\n".join(lines)


def default_title(runs: pd.DataFrame) -> str:
    """E.g. "cifar10 on t4v100x8 (sim): 11 controllers x 5 scenarios x 5 seeds"."""
    contexts = "; ".join(
        f"{w} on {c} ({b})" for b, w, c in runs[CONTEXT_KEYS].drop_duplicates().itertuples(index=False)
    )
    counts = [runs[k].nunique() for k in ("controller", "scenario", "seed")]
    return f"{contexts}: {counts[0]} controllers x {counts[1]} scenarios x {counts[2]} seeds"


def aggregate_command(cfg: DictConfig) -> str:
    """This run's own command line."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra (called from Python)
        overrides = [f"sweep_dir={cfg.sweep_dir}", f"out={cfg.out}"]
    return " ".join(["python -m experiments.aggregate", *map(shlex.quote, overrides)])


@hydra.main(version_base=None, config_path="../conf", config_name="aggregate")
def main(cfg: DictConfig) -> None:
    _, plots = aggregate(cfg)
    out = Path(to_absolute_path(cfg.out))
    print(console_summary((out / "table.md").read_text(), out, plots), file=sys.stdout)


if __name__ == "__main__":
    main()
