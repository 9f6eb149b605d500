"""Real elastic training: a 1 -> 2 -> 1 rank change against unchanged runs, restarts measured.

    python -m experiments.elastic_real                       # conf/elastic_real.yaml
    python -m experiments.elastic_real out=results/elastic/real_restart.json unchanged_seeds=[0,1,2]

Trains the digits CNN on gloo CPU ranks (``adapters.elastic.run_schedule``) once at the elastic
schedule and once per seed at one rank throughout, all at the same global batch, and writes the
final accuracies, the unchanged runs' spread and every measured restart (re-forming the group at
the new size from the checkpoint) to ``out``. Returns the median restart time in seconds.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import hydra
import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from adapters.config import RealDDPConfig
from adapters.elastic import run_schedule
from experiments.reports.elastic import host_record
from sim.datafiles import atomic_write_text

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    schedule = [int(n) for n in raw["schedule"]]
    kw = {"global_batch": int(raw["global_batch"]), "iterations": int(raw["iterations"])}
    # Restarts are mostly process start-up (spawn, import torch, rendezvous), which a loaded host
    # stretches several-fold: the load is part of the measurement.
    load_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:

        def config(name: str) -> RealDDPConfig:
            return RealDDPConfig(**{**raw["backend"], "checkpoint_dir": str(Path(tmp) / name)})

        unchanged = {
            int(s): run_schedule(config(f"u{s}"), [1] * len(schedule), seed=int(s), **kw)
            for s in raw["unchanged_seeds"]
        }
        elastic = run_schedule(config("elastic"), schedule, seed=int(raw["elastic_seed"]), **kw)
    finals = [r["final_accuracy"] for r in unchanged.values()]
    restarts = [r["restart_s"] for r in elastic["restarts"]]
    result = {
        "schedule": schedule,
        "global_batch": kw["global_batch"],
        "iterations_per_interval": kw["iterations"],
        "elastic": elastic,
        "unchanged_final_accuracy": {str(s): r["final_accuracy"] for s, r in unchanged.items()},
        "unchanged_spread": [min(finals), max(finals)],
        "within_spread": bool(min(finals) - 0.01 <= elastic["final_accuracy"] <= max(finals) + 0.01),
        "restart_s": restarts,
        "median_restart_s": float(np.median(restarts)) if restarts else 0.0,
        "backend": raw["backend"],
        "host": host_record(load_start),
    }
    out = Path(to_absolute_path(raw["out"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    log.info(
        "elastic %s: final accuracy %.4f (unchanged %s), restarts %s s",
        schedule,
        elastic["final_accuracy"],
        finals,
        [round(r, 2) for r in restarts],
    )
    return result["median_restart_s"]


@hydra.main(version_base=None, config_path="../conf", config_name="elastic_real")
def main(cfg: DictConfig) -> float:
    return run(cfg)


if __name__ == "__main__":
    main()
