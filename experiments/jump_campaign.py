"""Real runs that provoke instability: a jump of the global batch (and so, under a scaling rule, of
the learning rate), early or late in training, with the guards' learning-rate ramp on or off.

    python -m experiments.jump_campaign                      # conf/jump_campaign.yaml: 192 runs, ~15 min
    python -m experiments.jump_campaign seeds=[0,1] jumps=[8] out_dir=/tmp/jumps

Each run trains ``points[point]`` intervals at the base batch, then ``post`` intervals at ``jump``
times that global batch. The watchdog is off (its thresholds out of reach): every collapse runs its
course and is measured. A *collapse*: the validation quality falls ``collapse_drop`` (the task's, if it sets one) below its value
before the jump, or the loss goes non-finite. One row per run in ``runs.csv`` (resumable: runs
already there are skipped): the learning rate before and after, the lowest and last quality after
the jump, the depth. ``python -m experiments.fit_instability`` fits the simulator's term to it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from adapters.ddp_backend import DDPBackend
from experiments.common import atomic_write_text, plain
from sim.guards import TrainingDiverged
from sim.scaling import lr_gain

log = logging.getLogger(__name__)

KEY = ("rule", "ramp", "point", "jump", "seed")


def campaign_guards(ramp: int) -> dict[str, Any]:
    """The guards of a campaign run: the ramp under test, no cap, a watchdog that never fires on
    quality or loss; a non-finite loss still fires it, and the run stops there as diverged (the
    deepest collapse), whatever the guards did about it."""
    return {"mode": "act", "max_lr_gain": None, "lr_ramp_iters": int(ramp), "quality_drop": 1.0,
            "loss_factor": None, "patience": 10**6, "snapshot_tolerance": 0.0}  # fmt: skip


def run_one(
    backend: DDPBackend, rule: str, pre: int, jump: int, seed: int, cfg: DictConfig
) -> dict[str, Any]:
    from dataclasses import replace

    backend.config = replace(backend.config, lr_rule=rule)  # coordinator-side: sent with every interval
    backend.reset(seed=seed)
    k = int(cfg.interval)
    small = backend.spec.initial_batch
    big = small * int(jump)
    qualities, lrs = [], []
    diverged, jump_lr = False, math.nan
    try:
        for i in range(pre + int(cfg.post)):
            if i == pre:  # the rate the jump asks for, known before it runs (a run may diverge at once)
                gain = lr_gain(rule, int(big.sum()), backend.spec.base_batch, backend.noise.noise_scale)
                jump_lr = backend.config.base_lr * gain
            report = backend.run_interval(small if i < pre else big, k)
            if backend.guard.events:  # only a non-finite loss fires these guards (then rolled back)
                diverged = True
                break
            qualities.append(report.val_accuracy)
            lrs.append(max(backend.last_replies[0]["lr"], 0.0))
    except TrainingDiverged:  # non-finite before any snapshot: nothing to roll back to
        diverged = True
    drop = float(plain(cfg.tasks[cfg.task]).get("collapse_drop", cfg.collapse_drop))
    before = qualities[pre - 1] if len(qualities) >= pre else math.nan
    after = qualities[pre:]
    low = min(after) if after else math.nan
    depth = 1.0 if diverged else max(before - low, 0.0)
    return {
        "quality_before": before,
        "lowest_after": low,
        "final": qualities[-1] if not diverged else math.nan,
        "depth": depth,
        "diverged": diverged,
        "collapsed": diverged or depth >= drop,
        "collapse_drop": drop,
        "lr_before": lrs[pre - 1] if len(lrs) >= pre else math.nan,
        "lr_after": max([jump_lr, *lrs[pre:]]) if len(qualities) >= pre else math.nan,
        "intervals_after": len(after),
    }


@hydra.main(version_base=None, config_path="../conf", config_name="jump_campaign")
def main(cfg: DictConfig) -> None:
    out = Path(hydra.utils.to_absolute_path(str(cfg.out_dir)))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.csv"
    done = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=[*KEY])
    seen = {tuple(r) for r in done[list(KEY)].astype(str).itertuples(index=False)}
    task = plain(cfg.tasks[cfg.task])
    base = {k: tuple(v) if isinstance(v, list) else v for k, v in task["backend"].items()}
    rows = done.to_dict("records")
    plan = [
        (rule, int(ramp), point, int(jump), int(seed))
        for ramp in cfg.ramps for rule in cfg.rules for point in cfg.points for jump in cfg.jumps for seed in cfg.seeds
    ]  # fmt: skip
    todo = [p for p in plan if tuple(map(str, p)) not in seen]
    backends: dict[int, DDPBackend] = {}
    try:
        for rule, ramp, point, jump, seed in tqdm(todo, desc=f"jump campaign ({cfg.task})"):
            if ramp not in backends:
                for b in backends.values():
                    b.close()
                backends = {ramp: DDPBackend(**base, guards=campaign_guards(ramp))}
            row = run_one(backends[ramp], rule, int(cfg.points[point]), jump, seed, cfg)
            rows.append(
                {
                    "task": cfg.task,
                    "rule": rule,
                    "ramp": ramp,
                    "point": point,
                    "jump": jump,
                    "seed": seed,
                    **row,
                }
            )
            atomic_write_text(path, pd.DataFrame(rows).to_csv(index=False))  # resumable
    finally:
        for b in backends.values():
            b.close()
    runs = pd.DataFrame(rows)
    table = runs.groupby(["rule", "ramp", "point", "jump"]).agg(
        runs=("seed", "size"), collapses=("collapsed", "sum"), diverged=("diverged", "sum"),
        depth=("depth", "median"), lr_ratio=("lr_after", "median"),
    )  # fmt: skip
    print(table.to_string())
    log.info("%d runs in %s", len(runs), path)


if __name__ == "__main__":
    main()
