"""Overhead of the drop-in controller on real DDP training, measured side by side in one run.

    python -m experiments.bench_adapter

Two gloo ranks train identical replicas at the same local batches, alternating segments of
plain DDP and of DDP with :class:`adapters.torchrun.DynamixController` (metrics, decisions,
broadcasts every K iterations; every loop validates at the same cadence), with its guards on and
off (the guards' own cost when nothing fires: target <= 1%). Prints the ratio of
controller to plain training time (median over rounds of the per-round ratio, ratio of the fastest
segments, and of the totals) and the controller's own measured time as a fraction; writes ``results/adapter/overhead.json``. Target: overhead < 2%.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from adapters.bench import bench_rank, summarise
from experiments.common import atomic_write_text, hydra_app


def run(cfg: DictConfig) -> dict:
    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False)
    conf = OmegaConf.to_container(cfg, resolve=True)
    parent, child = ctx.Pipe()
    procs = [
        ctx.Process(
            target=bench_rank, args=(r, int(cfg.workers), store.port, conf, child if r == 0 else None)
        )
        for r in range(int(cfg.workers))
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 1800
        while not parent.poll(1.0):
            dead = [r for r, p in enumerate(procs) if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"benchmark ranks {dead} exited without a result (see their output above)")
        out = parent.recv()
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    result = summarise(out["rows"])
    result.update(
        config={
            k: conf[k]
            for k in ("workers", "dataset", "model", "batch", "interval", "iterations", "rounds", "policy")
        }
        | {"device": conf.get("device", "cpu")},
        decisions=out["decisions"],
        guards={"config": conf.get("guards") or "defaults (sim.guards.GuardConfig)", **out["guard"]},
        decision_timings_rank0_s=out["timings"],
        machine={"cpu_count": os.cpu_count(), "python": platform.python_version()},
        command="python -m experiments.bench_adapter",
    )
    print(
        f"Controller overhead on real DDP ({cfg.workers} gloo ranks on {conf.get('device', 'cpu')}, "
        f"{cfg.model}/{cfg.dataset}, "
        f"local batch {cfg.batch}, K = {cfg.interval}, {cfg.iterations} steps per segment)"
    )
    print(
        f"{'round':>5}{'plain DDP s':>13}{'DDP+py hook s':>15}{'with controller s':>19}{'ratio':>8}"
        f"{'controller self s':>19}"
    )
    cols = zip(
        result["plain_s"],
        result["plain_hook_s"],
        result["controller_s"],
        result["controller_self_s"],
        strict=True,
    )
    for i, (tp, th, tc, over) in enumerate(cols):
        print(f"{i:>5}{tp:>13.3f}{th:>15.3f}{tc:>19.3f}{tc / tp:>8.3f}{over:>19.4f}")
    print(
        f"ratio controller / plain DDP: median over rounds {result['ratio_median']:.4f}, "
        f"fastest segments {result['ratio_min']:.4f}, total {result['ratio_total']:.4f} "
        f"(95% bootstrap over rounds [{result['ratio_total_ci95'][0]:.4f}, "
        f"{result['ratio_total_ci95'][1]:.4f}]); "
        f"vs DDP with a Python hook: {result['ratio_vs_hook_total']:.4f}; "
        f"controller's own measured time {100 * result['self_fraction']:.2f}% of training time"
    )
    print(
        f"guards (nothing fired: {out['guard']['guard_firings']} firings, "
        f"{out['guard']['guard_rollbacks']} rollbacks) / the same controller with guards off: "
        f"total {result['guard_ratio_total']:.4f} (95% bootstrap [{result['guard_ratio_total_ci95'][0]:.4f}, "
        f"{result['guard_ratio_total_ci95'][1]:.4f}]), median over rounds {result['guard_ratio_median']:.4f}; "
        "target <= 1.01"
    )
    path = Path(to_absolute_path(cfg.out))
    atomic_write_text(path, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return result


main = hydra_app("bench_adapter", run, "ratio_median", __spec__)


if __name__ == "__main__":
    main()
