"""Runs that provoke collapses, to choose and check the guards' defaults (:mod:`sim.guards`).

    python -m experiments.guard_campaign                      # every job, seeds 0-7, watch and act
    python -m experiments.guard_campaign run=[reckless] seeds=[0,1]
    python -m experiments.guard_campaign +guards.quality_drop=0.2 out_dir=/tmp/g

Each job (``conf/guard_campaign.yaml``) runs on real CPU ranks once per seed under ``guards=watch``,
which is bit-for-bit the unguarded run plus what the watchdog would have done, and once under
``guards=act``. A run *collapsed* when its last validation quality lies ``collapse_drop`` below its
best and short of the target. The watch runs tell the watchdog's misses (a collapse it never fired
on), its false alarms (a firing in a run that did not collapse) and its delay (intervals from the
first interval of a collapse to the firing); the act runs tell what the guards cost or save: time
to the target, rollbacks, time lost. Writes ``runs.csv`` and ``README.md`` (medians with bootstrap
intervals, scipy) to ``out_dir``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig
from scipy.stats import bootstrap
from tqdm import tqdm

from adapters.ddp_backend import DDPBackend
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode
from experiments.common import atomic_write_text, plain
from experiments.reports.markdown import table
from sim.guards import TrainingDiverged

log = logging.getLogger(__name__)


def first_collapse(qualities: list[float], drop: float) -> int | None:
    """The first interval at least ``drop`` below the best quality before it (None: none)."""
    best = -math.inf
    for i, q in enumerate(qualities):
        if q < best - drop:
            return i
        best = max(best, q)
    return None


def run_one(
    job: dict[str, Any], controller: Any, mode: str, guards: dict, seed: int, cfg: DictConfig
) -> dict:
    backend = DDPBackend(**job["backend"], guards={**guards, "mode": mode})
    env = HeteroClusterEnv(backend=backend, interval=int(cfg.interval), action_mode=controller.action_mode)
    row: dict[str, Any] = {"mode": mode, "seed": seed}
    try:
        result = run_episode(env, controller, seed, max_steps=int(cfg.max_decisions))
        tl = result.timeline
        qualities = [r["val_accuracy"] for r in tl]
        row.update(
            reached=bool(result.summary["reached_target"]),
            time_to_target_s=result.summary["time_to_accuracy_s"],
            total_time_s=result.summary["total_time_s"],
            best_quality=max(qualities),
            final_quality=qualities[-1],
            diverged=False,
            first_collapse=first_collapse(qualities, float(cfg.collapse_drop)),
            # the run's validation series: the watchdog replayed on the watch runs (report's grid)
            qualities=json.dumps([round(q, 5) for q in qualities]),
            losses=json.dumps([round(r["val_loss"], 5) for r in tl]),
        )
    except TrainingDiverged as err:  # the loss went non-finite and nothing could be rolled back
        row.update(reached=False, time_to_target_s=math.nan, total_time_s=backend.wall_time_s(),
                   best_quality=math.nan, final_quality=math.nan, diverged=True, first_collapse=None)  # fmt: skip
        log.info("seed %d (%s) diverged: %s", seed, mode, err)
    finally:
        env.close()
    guard = backend.guard
    row.update(guard.summary())
    row["first_firing"] = guard.events[0].interval if guard.events else None
    row["collapsed"] = bool(row["diverged"]) or (
        not row["reached"] and row["final_quality"] < row["best_quality"] - float(cfg.collapse_drop)
    )
    return row


def median_ci(values: np.ndarray, seed: int = 0) -> str:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "none reached"
    if v.size < 3 or np.ptp(v) == 0:
        return f"{np.median(v):.2f} (n={v.size})"
    ci = bootstrap(
        (v,), np.median, confidence_level=0.95, rng=np.random.default_rng(seed)
    ).confidence_interval
    return f"{np.median(v):.2f} [{ci.low:.2f}, {ci.high:.2f}] (n={v.size})"


def report(runs: pd.DataFrame, cfg: DictConfig) -> str:
    lines = [
        "# The guards under provoked collapses",
        "",
        f"Regenerate: `python -m experiments.guard_campaign` (seeds {list(cfg.seeds)}, K={cfg.interval}, at most "
        f"{cfg.max_decisions} decisions; guards {plain(cfg.guards) or 'at their defaults'}). Real CPU ranks on a "
        "shared machine: times are noisy, counts are not.",
        "",
        "`watch` is bit-for-bit the unguarded run, with what the watchdog would have done; `act` is the "
        f"guards on. A run collapsed when it ended short of the target {cfg.collapse_drop} below its best "
        "quality, or its loss went non-finite with nothing to roll back to.",
        "",
    ]
    header = [
        "job",
        "mode",
        "runs",
        "collapsed",
        "reached",
        "time to target, s (median [95% CI])",
        "rollbacks",
    ]
    header += ["time lost, s", "watchdog: missed / false alarms / delay (intervals)"]
    rows = []
    for (job, mode), g in runs.groupby(["job", "mode"], sort=False):
        watch = ""
        if mode == "watch":
            col = g[g.collapsed & ~g.diverged]
            missed = int((col.first_firing.isna()).sum())
            false = int((~g.collapsed & g.first_firing.notna()).sum())
            delays = (col.first_firing - col.first_collapse).dropna()
            delay = f"{delays.median():.0f} (max {delays.max():.0f})" if len(delays) else "-"
            watch = f"{missed} / {false} / {delay}"
        tta = median_ci(g.time_to_target_s.to_numpy())
        counts = [len(g), int(g.collapsed.sum()), int(g.reached.sum()), tta, int(g.guard_rollbacks.sum())]
        rows.append([job, mode, *counts, f"{g.guard_time_lost_s.sum():.1f}", watch])
    return "\n".join(lines + table(header, rows)) + "\n"


@hydra.main(version_base=None, config_path="../conf", config_name="guard_campaign")
def main(cfg: DictConfig) -> None:
    out = Path(hydra.utils.to_absolute_path(str(cfg.out_dir)))
    guards = plain(cfg.guards) or {}
    rows = []
    unknown = sorted(set(cfg.run) - set(cfg.jobs))
    if unknown:
        raise ValueError(f"run names unknown jobs {unknown}; known: {sorted(cfg.jobs)}")
    plan = [(name, seed, mode) for name in cfg.run for seed in cfg.seeds for mode in cfg.modes]
    for name, seed, mode in tqdm(plan, desc="guard campaign"):
        job = plain(cfg.jobs[name])
        job["backend"] = {k: tuple(v) if isinstance(v, list) else v for k, v in job["backend"].items()}
        controller = instantiate(cfg.jobs[name].controller)
        row = run_one(job, controller, str(mode), guards, int(seed), cfg)
        rows.append({"job": name, **row})
        log.info(
            "%s seed %d %s: %s",
            name,
            seed,
            mode,
            {k: row[k] for k in ("reached", "collapsed", "guard_rollbacks")},
        )
    runs = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "runs.csv", runs.to_csv(index=False))
    text = report(runs, cfg)
    atomic_write_text(out / "README.md", text)
    print(text)


if __name__ == "__main__":
    main()
