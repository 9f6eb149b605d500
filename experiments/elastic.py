"""Time and dollars to accuracy per controller on an elastic pool, on held-out seeds.

    python -m experiments.elastic                                  # conf/elastic.yaml
    python -m experiments.elastic seeds=[100,101,102] out_dir=results/elastic_tune

Runs every controller of ``controllers`` (fixed allocations, the goodput-per-dollar rule, the pool
oracle, learned bundles) and, when ``hindsight.enabled``, the hindsight-best fixed allocation per
seed (every allocation of ``hindsight.counts`` GPUs per offer, the cheapest that reaches the target
within ``hindsight.time_factor`` x the fastest fixed allocation's time on that seed: row
``hindsight_fixed``, held from t = 0) and, with ``hindsight.from_initial``, the same search over
the switch-once schedules that start on the pool's initial allocation and move to the grid's at
the first decision (row ``hindsight_switch``). Writes
``table.csv`` / ``table.md`` (means over seeds), ``episodes.csv`` (one row per controller x seed),
``timeline.csv`` (worker count and spend per step of ``plot_controllers`` on ``plot_seed``) and
``workers_spend.png``. Returns the best learned policy's mean dollars to accuracy.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.elastic.evaluation import run_elastic_episode
from dynamix_gym.elastic.hindsight import hindsight_fixed_allocation
from dynamix_gym.elastic.lineup import lineup
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from experiments.reports.elastic import csv_text, plot_workers_spend
from sim.datafiles import atomic_write_text

log = logging.getLogger(__name__)

COLUMNS = (
    "controller",
    "kind",
    "seeds",
    "reached",
    "time_to_accuracy_s",
    "dollars_to_accuracy",
    "mean_gpus",
    "restarts",
    "preemptions",
)


def _summary(name: str, kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in rows]))

    return {
        "controller": name,
        "kind": kind,
        "seeds": len(rows),
        "reached": sum(r["reached_target"] for r in rows),
        "time_to_accuracy_s": mean("time_to_accuracy_s"),
        "dollars_to_accuracy": mean("dollars_to_accuracy"),
        "mean_gpus": mean("mean_gpus"),
        "restarts": mean("restarts"),
        "preemptions": mean("preemptions"),
    }


def _hindsight(
    cfg: dict[str, Any],
    env_kwargs: dict[str, Any],
    seeds: list[int],
    fastest: dict[int, float],
    lr: float = 1.0,
    from_initial: bool = False,
):
    """Per seed, the cheapest allocation (from the grid) within the time factor, held from t = 0 or
    (``from_initial``) reached from the pool's initial allocation at the first decision; a seed on
    which none of the grid is in time has no row (the summary's ``seeds`` counts those that do)."""
    rows, form = [], "hindsight (from initial)" if from_initial else "hindsight"
    for seed in seeds:
        limit = cfg["time_factor"] * fastest[seed]
        best = hindsight_fixed_allocation(
            env_kwargs, seed, cfg["counts"], limit, lr_multiplier=lr, from_initial=from_initial
        )
        if best is None:
            log.info("%s seed %d: no allocation in time", form, seed)
        else:
            rows.append(best)
            log.info("%s seed %d: %s", form, seed, best["allocation"])
    return rows


def run(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    out = Path(to_absolute_path(raw["out_dir"]))
    env_kwargs = dict(raw["env"])
    seeds = [int(s) for s in raw["seeds"]]
    table, episodes, timelines = [], [], []
    fastest_fixed: dict[int, float] = {}
    baseline_lr = float(raw.get("baseline_lr_multiplier", 1.0))  # every baseline's constant multiplier
    for spec, ctl, kw in lineup(raw["controllers"], env_kwargs, baseline_lr, resolve=to_absolute_path):
        name = spec["name"]
        rows = []
        for seed in seeds:
            r = run_elastic_episode(ElasticClusterEnv(**kw), ctl, seed)
            rows.append(r)
            episodes.append(
                {"controller": name, "seed": seed, **{k: v for k, v in r.items() if k != "history"}}
            )
            if spec["kind"] == "fixed":
                fastest_fixed[seed] = min(fastest_fixed.get(seed, math.inf), r["time_to_accuracy_s"])
            if seed == raw["plot_seed"] and name in raw["plot_controllers"]:
                timelines += [{"controller": name, **h} for h in r["history"]]
        table.append(_summary(name, spec["kind"], rows))
        log.info("%s: %s", name, table[-1])
    hs = raw.get("hindsight") or {}
    if hs.get("enabled") and fastest_fixed:
        forms = [("hindsight_fixed", False)]
        if hs.get("from_initial"):
            forms.append(("hindsight_switch", True))
        for name, from_initial in forms:
            rows = _hindsight(hs, env_kwargs, seeds, fastest_fixed, baseline_lr, from_initial)
            if rows:
                table.append(_summary(name, "hindsight", rows))
            else:
                log.info("%s: no allocation of the grid reaches the target in time on any seed", name)
    _write(out, table, episodes, timelines)
    learned = [t["dollars_to_accuracy"] for t in table if t["kind"] == "learned"]
    return min(learned) if learned else math.nan


def _write(out: Path, table, episodes, timelines) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.csv", csv_text(table, COLUMNS))
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for t in table:
        cells = [f"{t[c]:.3f}" if isinstance(t[c], float) else str(t[c]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    if episodes:
        atomic_write_text(out / "episodes.csv", csv_text(episodes, list(episodes[0])))
    if timelines:
        cols = sorted({k for t in timelines for k in t}, key=lambda k: (k != "controller", k))
        atomic_write_text(out / "timeline.csv", csv_text(timelines, cols))
        plot_workers_spend(out / "workers_spend.png", timelines)


@hydra.main(version_base=None, config_path="../conf", config_name="elastic")
def main(cfg: DictConfig) -> float:
    return run(cfg)


if __name__ == "__main__":
    main()
