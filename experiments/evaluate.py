"""Evaluate one controller on one scenario and seed, on any backend.

    python -m experiments.evaluate controller=dlb scenario=throttle seed=0
    python -m experiments.evaluate -m controller=static,dlb,pollux scenario=static_hetero,throttle seed=0,1,2

Writes in the run's output dir:

* ``timeline.csv``: one row per decision interval (:func:`dynamix_gym.evaluation.timeline_row`:
  per-worker batches, iteration / compute / idle times, reward terms, validation accuracy);
* ``summary.csv``: one more row (appended atomically) with
  :data:`dynamix_gym.evaluation.SUMMARY_COLUMNS` and :data:`EXTRA_COLUMNS`.

Returns the time to accuracy in seconds, or ``inf`` when the run ends (time budget or
``env.max_decisions``) without reaching the target: a sweeper minimising it then ranks every
failure below every success, which a truncated run's total time (a budget, not a result) would not.

The backend is a config group (``conf/backend/``): an env factory called with the cluster,
workload, scenario and reward specs, the controller's ``action_mode`` and the ``env`` settings.
Another backend (``dynamix/RealDDP-v0``) is one more yaml there.
"""

from __future__ import annotations

import csv
import fcntl
import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate, to_absolute_path
from omegaconf import DictConfig

import dynamix_gym  # noqa: F401  (registers the envs the backend configs name)
from dynamix_gym.controllers.base import env_options
from dynamix_gym.evaluation import SUMMARY_COLUMNS, controller_label, run_episode
from dynamix_gym.reward import RewardConfig
from experiments.common import atomic_write_text, plain
from sim.profile import ClusterProfile, load_profile
from sim.specs_io import cluster_from_dict, scenario_from_dict, workload_from_dict

log = logging.getLogger(__name__)

#: Columns a summary row carries beyond SUMMARY_COLUMNS (what aggregation and plots need).
#: ``metric``, ``final_metric`` and ``target_metric`` give the workload's validation metric in its own
#: name and units (``final_accuracy`` and ``target_accuracy`` are the internal rising quality).
EXTRA_COLUMNS: tuple[str, ...] = (
    "cluster", "gpu_types", "target_accuracy", "time_budget_s", "interval",
    "metric", "final_metric", "target_metric",
)  # fmt: skip
COLUMNS: tuple[str, ...] = SUMMARY_COLUMNS + EXTRA_COLUMNS


def build_specs(cfg: DictConfig) -> dict[str, Any]:
    """The cluster, workload, scenario and reward of ``cfg`` as the simulator's and env's specs.

    With ``profile=<dir>`` (a calibrated profile, e.g. a bring-your-own workload's from
    ``experiments.calibrate``), the cluster and workload are the profile's and the ``cluster`` and
    ``workload`` groups are not used."""
    profile = profile_of(cfg)
    return {
        "cluster": profile.cluster if profile else cluster_from_dict(plain(cfg.cluster)),
        "workload": profile.workload if profile else workload_from_dict(plain(cfg.workload)),
        "scenario": scenario_from_dict(plain(cfg.scenario)),
        "reward": RewardConfig.from_any(plain(cfg.reward)),
    }


def profile_of(cfg: DictConfig) -> ClusterProfile | None:
    """The calibrated profile ``cfg.profile`` names (a directory or a shipped profile's name)."""
    ref = cfg.get("profile")
    if not ref:
        return None
    path = Path(to_absolute_path(str(ref)))
    return load_profile(path if path.exists() else str(ref))


def make_env(cfg: DictConfig, action_mode: str, specs: dict[str, Any] | None = None, **options: Any):
    """The env of ``cfg.backend`` over ``specs`` (default: :func:`build_specs`), in ``action_mode``,
    with ``options`` (a controller's :func:`~dynamix_gym.controllers.base.env_options`)."""
    factory = instantiate(cfg.backend)
    env_kwargs = {**plain(cfg.env), **options}
    profile = profile_of(cfg)
    if profile is not None:  # the simulator uses the profile's fitted models
        env_kwargs["profile"] = profile
    return factory(**(specs or build_specs(cfg)), action_mode=action_mode, **env_kwargs)


def evaluate(cfg: DictConfig, out_dir: str | Path | None = None) -> float:
    """Runs ``cfg.controller`` for one episode, writes the timeline and the summary row into
    ``out_dir`` (default: the Hydra run dir) and returns the time to accuracy (inf if missed)."""
    out = Path(out_dir) if out_dir is not None else Path(HydraConfig.get().runtime.output_dir)
    controller = instantiate(cfg.controller)
    specs = build_specs(cfg)
    env = make_env(cfg, controller.action_mode, specs, **env_options(controller))
    try:
        result = run_episode(env, controller, int(cfg.seed), scenario=specs["scenario"].name)
        spec = env.unwrapped.backend.spec
        interval = int(env.unwrapped.interval)
    finally:
        env.close()
    summary, tta = record_run(out, result, controller, specs, spec, interval)
    log.info(
        "%s on %s, seed %s: %s (final %s %.4f after %.1f min, %d decisions)",
        summary["controller"],
        summary["scenario"],
        summary["seed"],
        f"target reached in {tta / 60:.1f} min" if math.isfinite(tta) else "target not reached",
        summary["metric"],
        summary["final_metric"],
        summary["total_time_s"] / 60,
        summary["decisions"],
    )
    return tta


def record_run(
    out: Path,
    result: Any,
    controller: Any,
    specs: dict[str, Any],
    spec: Any,
    interval: int,
    step_offset: int = 0,
) -> tuple[dict[str, Any], float]:
    """Write an episode's ``timeline.csv`` and append its row to ``summary.csv`` in ``out``;
    returns the row and the time to accuracy (inf if the target was missed). ``step_offset``
    numbers the timeline's steps after those of a run it resumed."""
    summary = dict(result.summary)
    summary.update(
        controller=controller_label(controller),
        cluster=specs["cluster"].name,
        gpu_types=" ".join(spec.gpu_types),
        target_accuracy=spec.target_accuracy,
        time_budget_s=spec.time_budget_s,
        interval=interval,
        metric=spec.metric.name,
        final_metric=float(spec.metric.from_quality(summary["final_accuracy"])),
        target_metric=float(spec.metric.from_quality(spec.target_accuracy)),
    )
    timeline = pd.DataFrame(result.timeline)
    # The validation metric in its own units beside the quality (val_accuracy).
    timeline.insert(
        timeline.columns.get_loc("val_accuracy") + 1,
        "val_metric",
        spec.metric.from_quality(timeline["val_accuracy"].to_numpy()),
    )
    if step_offset:
        timeline["step"] += step_offset
    atomic_write_text(out / "timeline.csv", timeline.to_csv(index=False))
    append_csv_row(out / "summary.csv", summary, COLUMNS)
    tta = float(summary["time_to_accuracy_s"]) if summary["reached_target"] else math.inf
    return summary, tta


def append_csv_row(path: Path, row: dict[str, Any], columns: Sequence[str]) -> None:
    """Appends ``row`` to the CSV at ``path`` (creating it with a header), atomically: the file is
    rewritten through a temporary file and ``os.replace`` under an exclusive lock, so readers and
    concurrent writers never see a half-written row."""
    missing = [c for c in columns if c not in row]
    if missing:
        raise ValueError(f"summary row lacks columns {missing}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = path.read_text() if path.exists() else ""
        if old:
            header = next(csv.reader(io.StringIO(old)))
            if header != list(columns):
                raise ValueError(
                    f"{path} has columns {header}, not {list(columns)}; write to another run dir"
                )
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
        if not old:
            writer.writeheader()
        writer.writerow(row)
        atomic_write_text(path, old + buf.getvalue())


@hydra.main(version_base=None, config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float:
    return evaluate(cfg)


if __name__ == "__main__":
    main()
