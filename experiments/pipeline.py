"""The pipeline bench row: rivals, an optional policy and the hindsight limit on held-out worlds.

    python -m experiments.pipeline                   # conf/pipeline.yaml

Per scenario and test-split seed (the world and its faults are drawn from the seed), every
controller runs one episode of ``dynamix/PipelineCluster-v1`` and the hindsight limit replays the
same episode under its candidates (the controllers among them). Writes every row and the summary
(geometric means of time-to-target ratios; the limit's never-beaten check) to ``out``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig

from dynamix_gym.envs.pipeline_cluster import PipelineClusterEnv
from dynamix_gym.pipeline.controllers import CONTROLLERS
from dynamix_gym.pipeline.evaluation import hindsight_limit, run_pipeline_episode
from dynamix_gym.pipeline.worlds import task_seeds, world_fn
from experiments.common import REPO_ROOT, atomic_write_text, plain
from sim.datafiles import jsonable

log = logging.getLogger(__name__)


def make_controllers(names, policy: str | None):
    out = [CONTROLLERS[n]() for n in names]
    if policy:
        from dynamix_gym.pipeline.policy import PolicyController

        out.append(PolicyController(policy))
    return out


def geo_mean(x) -> float:
    x = np.asarray(list(x), dtype=np.float64)
    return (
        float(np.exp(np.log(x).mean())) if x.size and np.all(np.isfinite(x)) and np.all(x > 0) else math.nan
    )


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[tuple, dict[str, float]] = {}
    for r in rows:
        by.setdefault((r["scenario"], r["seed"]), {})[r["controller"]] = r["time_to_target_s"]
    names = sorted({r["controller"] for r in rows})
    out: dict[str, Any] = {"tasks": len(by)}

    def ratio(a: str, b: str, scenarios=None):
        vals = [  # over the tasks both reached (a miss of either side is no ratio: see "reached")
            t[a] / t[b]
            for (sc, _), t in by.items()
            if a in t and b in t and (scenarios is None or sc in scenarios)
            and math.isfinite(t[a]) and math.isfinite(t[b])
        ]  # fmt: skip
        return {"geo_mean": geo_mean(vals), "max": max(vals) if vals else math.nan, "n": len(vals)}

    for a in names:
        for b in names:
            if a != b:
                out[f"{a}/{b}"] = ratio(a, b)
    out["even/dynpipe_interference"] = ratio("even", "dynpipe", {"interference"})
    if "hindsight_limit" in names:
        beaten = [
            (k, c)
            for k, t in by.items()
            for c, v in t.items()
            if c != "hindsight_limit" and v < t["hindsight_limit"] - 1e-6
        ]
        out["limit_beaten_by"] = [f"{c} on {k}" for k, c in beaten]
    out["reached"] = {c: sum(1 for t in by.values() if math.isfinite(t.get(c, math.inf))) for c in names}
    return out


def run(cfg: DictConfig) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    merge = list(cfg.get("merge_from") or [])
    for path in merge:  # rows of runs over disjoint scenarios (e.g. two processes), summarised as one
        path = Path(path) if Path(path).is_absolute() else REPO_ROOT / path
        for r in json.loads(path.read_text())["rows"]:  # a miss is saved as null
            rows.append(
                {
                    **r,
                    "time_to_target_s": math.inf if r["time_to_target_s"] is None else r["time_to_target_s"],
                }
            )
    keys = [(r["scenario"], r["seed"], r["controller"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("merge_from: the files share (scenario, seed, controller) rows; merge disjoint runs")
    for scenario in [] if merge else cfg.scenarios:
        env = PipelineClusterEnv(world=world_fn(cfg.split, scenario), schedule=cfg.schedule,
                                 interval=int(cfg.interval), interval_s=cfg.interval_s)  # fmt: skip
        for seed in task_seeds(cfg.split, int(cfg.seeds_per_scenario)):
            ctrls = make_controllers(cfg.controllers, cfg.policy)
            for c in ctrls:
                rows.append({"scenario": scenario, **run_pipeline_episode(env, c, seed)})
            if cfg.limit:
                dyn = [
                    r
                    for r in rows
                    if r["controller"] == "dynpipe" and r["seed"] == seed and r["scenario"] == scenario
                ]
                stages = {None} | {r["stages"] for r in dyn}
                lim = hindsight_limit(env, seed, make_controllers(cfg.controllers, cfg.policy), tuple(stages))
                rows.append({"scenario": scenario, **lim})
            log.info("%s seed %d: %s", scenario, seed,
                     {r["controller"]: round(r["time_to_target_s"]) if math.isfinite(r["time_to_target_s"]) else None
                      for r in rows if r["seed"] == seed and r["scenario"] == scenario})  # fmt: skip
    summary = summarise(rows)
    result = {"config": plain(cfg), "summary": summary, "rows": rows}
    out = Path(cfg.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    atomic_write_text(out, json.dumps(jsonable(result), indent=1) + "\n")
    log.info("summary: %s", json.dumps(jsonable(summary)))
    return result


@hydra.main(version_base=None, config_path="../conf", config_name="pipeline")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
