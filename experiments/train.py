"""Offline PPO pretraining on simulated clusters.

    python -m experiments.train                               # defaults: conf/train.yaml
    python -m experiments.train experiment=train_headline     # the headline policy's preset
    python -m experiments.train run_dir=<dir>                 # resume an interrupted run from its last checkpoint
    python -m experiments.train_elastic learner=ppo           # the elastic learners have their own app

Its presets are ``conf/experiment/train_*.yaml``; the others in ``conf/experiment/`` are
``experiments.evaluate``'s (tests/experiments/test_launchers.py composes each with its app).
``experiment=train_elastic_*`` still runs an elastic learner (:mod:`experiments.train_elastic`)
from its ``elastic`` block; a command-line setting of this trainer's (``seed``, ``ppo.*``, ...),
which that learner would ignore, is refused then.

The composed configuration is checked against :class:`~dynamix_gym.learning.config.TrainConfig`
before anything runs: a key that is not one of its fields (a misspelling included), in the top
level or in ``expert_pretrain``, is an error naming it.

Writes ``<run_dir>/best`` (the bundle with the best validation time-to-accuracy), ``<run_dir>/policy``
(the final bundle), checkpoints and TensorBoard logs. Returns the best validation time-to-accuracy
in minutes (the metric the Optuna sweeper minimises); a failed or non-finite run raises, which a
sweep records as a failed trial before going on.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.benchmark.suite import validation_tasks
from dynamix_gym.learning.config import TrainConfig
from dynamix_gym.learning.training import train
from experiments.common import atomic_write_text
from experiments.train_schema import APP_KEYS

log = logging.getLogger(__name__)


def train_config(raw: dict[str, Any]) -> TrainConfig:
    """The :class:`TrainConfig` of the app's composed configuration ``raw`` (plain containers),
    checked field by field."""
    kwargs = {k: v for k, v in raw.items() if k not in APP_KEYS}
    kwargs["run_dir"] = to_absolute_path(str(raw["run_dir"]))
    kwargs["env"] = {**(raw.get("env") or {}), "reward": raw["reward"]}
    if kwargs.get("finetune_from"):
        kwargs["finetune_from"] = to_absolute_path(kwargs["finetune_from"])
    if raw.get("eval_benchmark_tasks"):
        kwargs["eval_tasks"] = validation_tasks(list(raw["eval_benchmark_tasks"]))
    return TrainConfig.from_mapping(kwargs)


def run(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    if raw.get("elastic"):  # dynamix/ElasticCluster-v0 learners (experiment=train_elastic_*)
        return run_elastic(raw)
    result = train(train_config(raw), config_dict=raw)
    out = Path(to_absolute_path(str(raw["run_dir"]))) / "train_summary.json"
    atomic_write_text(out, json.dumps(result, indent=2, default=str) + "\n")
    best_min = result["best_validation_tta_s"] / 60.0
    log.info("best validation time-to-accuracy: %.2f min (%s)", best_min, result["best_bundle"])
    return best_min


def benchmark_eval_tasks(names: list[str], split: str = "train") -> list[dict]:
    """The named tasks of dynamix-bench-v1's ``split`` as validation tasks (sim specs); see
    :func:`dynamix_gym.benchmark.suite.validation_tasks`."""
    return validation_tasks(names, split)


def _foreign_overrides() -> list[str]:
    """Command-line overrides of this trainer's keys (not ``elastic.*``, the preset, the run dir)."""
    try:
        overrides = HydraConfig.get().overrides.task
    except ValueError:  # no Hydra run (called from code)
        return []
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    own = ("elastic", "experiment", "run_dir", "hydra")
    return [k for k in keys if k.split(".", 1)[0] not in own and k.split("/", 1)[0] not in own]


def run_elastic(raw: dict) -> float:
    """Train the elastic learner of ``raw["elastic"]`` (``experiment=train_elastic_*``); returns
    the best validation dollars to accuracy."""
    from experiments.train_elastic import run_elastic as train_elastic_learner

    foreign = _foreign_overrides()
    if foreign:
        raise ValueError(
            f"{foreign[0]} is a setting of the cluster PPO trainer; an elastic learner (experiment="
            f"train_elastic_*) takes its settings under elastic.* (elastic.{foreign[0]}=...), or run "
            "python -m experiments.train_elastic learner=<ppo|sac|td3|ppo_cpu> with them"
        )
    return train_elastic_learner({**raw["elastic"], "run_dir": raw["run_dir"]}, config_dict=raw)


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    value = run(cfg)
    if not math.isfinite(value):
        # Raised, not returned: the Optuna sweeper records a raising trial as failed and goes on
        # (hydra.sweeper.max_failure_rate), whereas a returned NaN stops it.
        raise FloatingPointError(f"training produced a non-finite validation time-to-accuracy ({value})")
    return value


if __name__ == "__main__":
    main()
