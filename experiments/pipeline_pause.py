"""Measure what a re-partition of a real pipeline costs, for the simulator's pause.

    python -m experiments.pipeline_pause                   # conf/pipeline_pause.yaml

Runs the digits model on two CPU gloo stage ranks (:mod:`adapters.real_pipeline.ranks`) through a
sequence of partitions; each change stops at a step boundary, carries every block's state and
optimiser state by name, re-splits and restarts the ranks. A run's pause is its wall time minus
the slowest rank's step time (spawn, imports, gloo init, stage build, state load and save).
Writes the runs and their median pause to ``out`` (``sim/data/pipeline_pause.json``, read by
:mod:`sim.pipeline.simulator` as its ``repartition_pause_s`` default).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
from pathlib import Path

from omegaconf import DictConfig

from adapters.real_pipeline.ranks import run_stages
from experiments.common import REPO_ROOT, atomic_write_text, hydra_app, plain

log = logging.getLogger(__name__)


def measure(cfg: DictConfig) -> dict:
    runs, state, optim, step = [], None, None, 0
    for sizes in cfg.partitions:
        cuts = [0]
        for s in sizes:
            cuts.append(cuts[-1] + int(s))
        r = run_stages(cuts, steps=int(cfg.steps), micro_batches=int(cfg.micro_batches), state=state, optim=optim,
                       first_step=step, timeout_s=float(cfg.timeout_s))  # fmt: skip
        state, optim, step = r["state"], r["optim"], step + int(cfg.steps)
        train = max(sum(s) for s in r["step_s"])
        runs.append({"sizes": list(sizes), "wall_s": r["wall_s"], "train_s": train, "pause_s": r["wall_s"] - train,
                     "ready_s": r["ready_s"]})  # fmt: skip
        log.info("partition %s: pause %.2f s (wall %.2f s)", list(sizes), runs[-1]["pause_s"], r["wall_s"])
    pauses = [r["pause_s"] for r in runs[1:]]  # the first run is the job's start, not a re-partition
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {
        "repartition_pause_s": statistics.median(pauses),
        "runs": runs,
        "generated_by": "python -m experiments.pipeline_pause",
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_1min": load,
            "python": platform.python_version(),
        },
        "config": plain(cfg),
    }
    out = Path(cfg.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    log.info("median re-partition pause %.2f s -> %s", result["repartition_pause_s"], out)
    return result


main = hydra_app("pipeline_pause", measure, "repartition_pause_s", __spec__)


if __name__ == "__main__":
    main()
