"""The ``dynamix-gym`` console command: one subcommand per Hydra entry point of ``experiments/``.

    dynamix-gym evaluate controller=dlb scenario=throttle     # == python -m experiments.evaluate ...
    dynamix-gym train experiment=train_quick
    dynamix-gym evaluate -m controller=static,dlb seed=0,1    # a grid: Hydra's flags pass through
    dynamix-gym deploy --help                                 # the app's Hydra help
    dynamix-gym --help                                        # the subcommands

Everything after the subcommand goes to the app unchanged (Hydra overrides and flags); the app runs
in this process as ``python -m experiments.<app>`` would run it, from the current directory
(relative paths in the configs, ``outputs/``, ``results/``, are relative to it, as there). The apps
live in the repository's ``experiments`` package and read ``conf/`` beside it: the command is for
a checkout installed with ``pip install -e .``.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

#: subcommand -> (module it runs, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("experiments.train", "pretrain a PPO policy on simulated clusters (conf/train.yaml)"),
    "evaluate": (
        "experiments.evaluate",
        "one controller on one simulated or real scenario, or a grid with -m",
    ),
    "aggregate": ("experiments.aggregate", "a sweep of evaluate runs into a table and plots"),
    "benchmark": ("experiments.benchmark", "score a controller on dynamix-bench-v1 (conf/benchmark/v1.yaml)"),
    "deploy": ("experiments.deploy", "a controller on real PyTorch DDP training"),
    "calibrate": (
        "experiments.calibrate",
        "profile real DDP ranks (or a measured table) into a simulator profile",
    ),
    "fidelity": ("experiments.fidelity", "sim-to-real fidelity of a calibrated profile"),
    "schedules": ("experiments.schedules", "batch schedules on real DDP beside the calibrated simulator"),
    "fit_schedules": ("experiments.fit_schedules", "refit a profile's convergence model to schedule runs"),
    "serve": ("experiments.serve", "the arbitrator service: PPO bundles over gRPC"),
    "demo": ("experiments.demo", "`make demo`: pretrain, evaluate beside the baselines, tabulate"),
    "elastic": ("experiments.elastic", "time and dollars to accuracy on an elastic spot pool"),
    "pipeline": (
        "experiments.pipeline",
        "pipeline parallelism: rivals, policy and hindsight limit on the pipeline split",
    ),
    "pipeline_train": ("experiments.pipeline_train", "train the pipeline policy (MaskablePPO)"),
    "pipeline_forest": ("experiments.pipeline_forest", "fit DynPipe's stage slowdown forest"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}  [python -m {module}]" for name, (module, text) in COMMANDS.items()]
    return (
        "usage: dynamix-gym <command> [hydra overrides and flags ...]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`dynamix-gym <command> --help` shows that app's configuration."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand named by ``argv[0]`` with the rest as its command line; the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"dynamix-gym: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    saved = sys.argv
    sys.argv = [f"dynamix-gym {name}", *rest]  # what Hydra parses (argv[1:]) as `python -m` would get
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # Hydra exits on --help, --cfg and errors
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
