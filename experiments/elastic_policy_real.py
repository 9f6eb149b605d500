"""Elastic controllers, a policy trained in simulation among them, on real ranks and in the simulator.

    python -m experiments.elastic_policy_real                                   # conf/elastic_policy_real.yaml
    python -m experiments.elastic_policy_real real_seeds=[0] sim_seeds=[0,1] out_dir=/tmp/epr   # a quick look

Every controller of ``controllers`` (entries as in ``experiments.elastic``: fixed allocations, the
goodput-per-dollar rule, learned bundles) runs on the pool ``env.pool`` twice over, through the same
``dynamix/ElasticCluster-v0`` code: on ``sim_seeds`` in the simulator (the pool's calibrated
profile) and on ``real_seeds`` on real gloo ranks (``adapters.elastic_job.RealElasticBackend``), where
a change of the worker count re-forms the process group from the checkpoint and the restart is
measured. Writes ``table.csv`` / ``table.md`` (per controller: mean time and dollars to accuracy in
each, the real median, restarts and their measured seconds, real / sim time), ``episodes.csv`` and
``summary.json`` (host load), and for ``plot_controllers`` the ranks held and the spend over the
first real seed (``timeline.csv``, ``workers_spend.png``). Returns the first learned controller's real mean time to
accuracy (``nan`` without one).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from adapters.ddp_backend import TrainingDiverged, WorkerFailure
from adapters.elastic_job import RealElasticBackend
from dynamix_gym.elastic.evaluation import run_elastic_episode
from dynamix_gym.elastic.lineup import lineup
from dynamix_gym.elastic.pools import get_pool
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from experiments.reports.elastic import csv_text, host_record, plot_workers_spend
from sim.datafiles import atomic_write_text
from sim.pool import pool_from_dict
from sim.specs_io import spec_to_dict

log = logging.getLogger(__name__)

#: ElasticClusterEnv arguments that describe the simulated job (a real backend brings its own).
SIM_ONLY = (
    "pool",
    "workload",
    "scenario",
    "time_budget_s",
    "initial_batch",
    "lr_tolerance",
    "lr_exponent",
    "sim_kwargs",
)
COLUMNS = (
    "controller",
    "kind",
    "sim_reached",
    "sim_time_s",
    "sim_dollars",
    "real_reached",
    "real_time_s",
    "real_time_median_s",
    "real_dollars",
    "real_restarts",
    "real_restart_s",
    "real_over_sim_time",
)


def _real_env(env_kwargs: dict[str, Any], kw: dict[str, Any], real: dict[str, Any]) -> ElasticClusterEnv:
    """The env of a controller's ``kw`` over real ranks of the pool (its initial allocation, if the
    controller starts from its own, in the pool)."""
    pool = get_pool(env_kwargs["pool"])
    if kw.get("initial_allocation"):
        pool = pool_from_dict({**spec_to_dict(pool), "initial": dict(kw["initial_allocation"])})
    rest = {k: v for k, v in kw.items() if k not in SIM_ONLY and k != "initial_allocation"}
    return ElasticClusterEnv(backend=RealElasticBackend(pool, **real), **rest)


def _episode_row(name: str, backend: str, seed: int, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "controller": name,
        "backend": backend,
        "seed": seed,
        **{k: v for k, v in r.items() if k != "history"},
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.mean([r[key] for r in rows])) if rows else math.nan


def run(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    out = Path(to_absolute_path(raw["out_dir"]))
    env_kwargs = dict(raw["env"])
    real = dict(raw.get("real") or {})
    baseline_lr = float(raw.get("baseline_lr_multiplier", 1.0))
    load_start = [round(x, 2) for x in os.getloadavg()]
    table, episodes, timelines = [], [], []
    first_learned = math.nan
    for spec, ctl, kw in lineup(raw["controllers"], env_kwargs, baseline_lr, resolve=to_absolute_path):
        name = spec["name"]
        sim_rows = [run_elastic_episode(ElasticClusterEnv(**kw), ctl, int(s)) for s in raw["sim_seeds"]]
        real_rows = []
        for seed in raw["real_seeds"]:
            env = _real_env(env_kwargs, kw, real)
            try:
                r = run_elastic_episode(env, ctl, int(seed))
                r["restart_s"] = env.job.restart_times_s
                r["error"] = ""
            except (TrainingDiverged, WorkerFailure) as err:  # a failed run is a result, not a crash
                log.warning("%s seed %s on real ranks failed: %s", name, seed, err)
                r = {"time_to_accuracy_s": math.inf, "dollars_to_accuracy": math.inf, "reached_target": False}
                r.update(restarts=env.job.restarts, restart_s=[], error=str(err))
            finally:
                env.close()
            real_rows.append(r)
            log.info(
                "%s real seed %s: %.2f s, $%.6f, restarts %s",
                name,
                seed,
                r["time_to_accuracy_s"],
                r["dollars_to_accuracy"],
                r.get("restart_s"),
            )
        if name in raw.get("plot_controllers", []) and real_rows and "history" in real_rows[0]:
            timelines += [{"controller": name, **h} for h in real_rows[0]["history"]]
        episodes += [
            _episode_row(name, "sim", int(s), r) for s, r in zip(raw["sim_seeds"], sim_rows, strict=True)
        ]
        episodes += [
            _episode_row(name, "real", int(s), r) for s, r in zip(raw["real_seeds"], real_rows, strict=True)
        ]
        restarts_s = [t for r in real_rows for t in r["restart_s"]]
        sim_t, real_t = _mean(sim_rows, "time_to_accuracy_s"), _mean(real_rows, "time_to_accuracy_s")
        row = {
            "controller": name,
            "kind": spec["kind"],
            "sim_reached": f"{sum(r['reached_target'] for r in sim_rows)}/{len(sim_rows)}",
            "sim_time_s": sim_t,
            "sim_dollars": _mean(sim_rows, "dollars_to_accuracy"),
            "real_reached": f"{sum(r['reached_target'] for r in real_rows)}/{len(real_rows)}",
            "real_time_s": real_t,
            "real_time_median_s": float(np.median([r["time_to_accuracy_s"] for r in real_rows]))
            if real_rows
            else math.nan,
            "real_dollars": _mean(real_rows, "dollars_to_accuracy"),
            "real_restarts": _mean(real_rows, "restarts"),
            "real_restart_s": float(np.mean(restarts_s)) if restarts_s else 0.0,
            "real_over_sim_time": real_t / sim_t if sim_t > 0 else math.nan,
        }
        table.append(row)
        log.info("%s: %s", name, row)
        if spec["kind"] == "learned" and math.isnan(first_learned):
            first_learned = real_t
    summary = {
        "pool": env_kwargs["pool"],
        "sim_seeds": raw["sim_seeds"],
        "real_seeds": raw["real_seeds"],
        "host": host_record(load_start),
        "table": table,
    }
    _write(out, table, episodes, summary)
    if timelines:
        cols = list(dict.fromkeys(k for t in timelines for k in t))
        atomic_write_text(out / "timeline.csv", csv_text(timelines, cols))
        title = f"real ranks, seed {raw['real_seeds'][0]}: ranks held and dollars spent"
        plot_workers_spend(
            out / "workers_spend.png", timelines, title, seconds_per_unit=1.0, unit="s", ylabel="ranks held"
        )
    return first_learned


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6f}" if 0 < abs(v) < 0.01 else f"{v:.3f}"
    return str(v)


def _write(out: Path, table: list[dict], episodes: list[dict], summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.csv", csv_text(table, COLUMNS))
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(t[c]) for c in COLUMNS) + " |" for t in table]
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    if episodes:
        cols = list(dict.fromkeys(k for e in episodes for k in e))
        atomic_write_text(out / "episodes.csv", csv_text(episodes, cols))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")


@hydra.main(version_base=None, config_path="../conf", config_name="elastic_policy_real")
def main(cfg: DictConfig) -> float:
    return run(cfg)


if __name__ == "__main__":
    main()
