"""`make demo`: the short version of the headline experiment.

    python -m experiments.demo

1. pretrains a PPO policy for a few minutes (``experiments.train experiment=train_quick``);
2. evaluates it beside static batches and the rule-based baselines on the default T4/V100
   cluster (``experiments.evaluate -m``, one run per core in parallel);
3. aggregates the sweep into a table and plots (``experiments.aggregate``).

Every step is one of the project's entry points, run as a user would run it; the commands are
printed as they run. Output: ``runs/demo/`` (``table.md``, ``accuracy_vs_time.png``, ...).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig


def _run(args: list[str]) -> None:
    cmd = [sys.executable, "-m", *args]
    print("$", "python -m", " ".join(shlex.quote(a) for a in args), flush=True)
    subprocess.run(cmd, check=True)


def demo(cfg: DictConfig) -> Path:
    out = Path(to_absolute_path(cfg.out))
    train_dir, sweep_dir = out / "train", out / "sweep"
    t0 = time.perf_counter()
    _run(
        [
            "experiments.train",
            "experiment=train_quick",
            f"total_timesteps={cfg.train_timesteps}",
            f"run_dir={train_dir}",
        ]
    )
    print(f"pretraining took {time.perf_counter() - t0:.0f} s", flush=True)
    grid = [f"scenario={','.join(cfg.scenarios)}", f"seed={','.join(str(s) for s in cfg.seeds)}"]
    sweep = [f"hydra.sweep.dir={sweep_dir}"]
    _run(
        [
            "experiments.evaluate",
            "-m",
            "controller=ppo",
            f"controller.path={train_dir / 'best'}",
            *grid,
            *sweep,
        ]
    )
    _run(
        [
            "experiments.evaluate",
            "-m",
            "experiment=demo",  # static from the first interval, as in results/baselines
            "controller=static",
            f"controller.batch={','.join(str(b) for b in cfg.static_batches)}",
            *grid,
            *sweep,
        ]
    )
    _run(["experiments.evaluate", "-m", f"controller={','.join(cfg.baselines)}", *grid, *sweep])
    # prints the table and where it and the plots are
    _run(["experiments.aggregate", f"sweep_dir={sweep_dir}", f"out={out}", "title=dynamix-gym demo"])
    print(f"Demo finished in {time.perf_counter() - t0:.0f} s.")
    return out


@hydra.main(version_base=None, config_path="../conf", config_name="demo")
def main(cfg: DictConfig) -> None:
    demo(cfg)


if __name__ == "__main__":
    main()
