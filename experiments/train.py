"""Offline PPO pretraining on simulated clusters.

    python -m experiments.train                               # defaults: conf/train.yaml
    python -m experiments.train experiment=train_headline     # the headline policy's preset
    python -m experiments.train run_dir=<dir>                 # resume an interrupted run from its last checkpoint
    python -m experiments.train experiment=train_elastic_ppo  # dynamix/ElasticCluster-v0 (also _sac)

Its presets are ``conf/experiment/train_*.yaml``; the others in ``conf/experiment/`` are
``experiments.evaluate``'s (tests/experiments/test_launchers.py composes each with its app).

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

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from dynamix_gym.learning.training import TrainConfig, train
from experiments.common import atomic_write_text

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    if raw.get("elastic"):  # dynamix/ElasticCluster-v0 learners (experiment=train_elastic_*)
        return run_elastic(raw)
    fields = set(TrainConfig.__dataclass_fields__)
    kwargs = {k: v for k, v in raw.items() if k in fields}
    kwargs["run_dir"] = to_absolute_path(str(raw["run_dir"]))
    kwargs["env"] = {**raw.get("env", {}), "reward": raw["reward"]}
    if kwargs.get("finetune_from"):
        kwargs["finetune_from"] = to_absolute_path(kwargs["finetune_from"])
    if raw.get("eval_benchmark_tasks"):
        kwargs["eval_tasks"] = benchmark_eval_tasks(list(raw["eval_benchmark_tasks"]))
    result = train(TrainConfig(**kwargs), config_dict=raw)
    out = Path(kwargs["run_dir"]) / "train_summary.json"
    atomic_write_text(out, json.dumps(result, indent=2, default=str) + "\n")
    best_min = result["best_validation_tta_s"] / 60.0
    log.info("best validation time-to-accuracy: %.2f min (%s)", best_min, result["best_bundle"])
    return best_min


def benchmark_eval_tasks(names: list[str], split: str = "train") -> list[dict]:
    """The named tasks of dynamix-bench-v1's ``split`` as validation tasks (sim specs). Validation
    may use the train split only: the test split is for scoring alone."""
    from experiments.benchmark import split_tasks, task_specs

    if split != "train":
        raise ValueError(f"validation tasks come from the benchmark's train split, not {split!r}")
    bench = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "benchmark" / "v1.yaml")
    tasks, _ = split_tasks(bench, split)
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        raise ValueError(
            f"eval_benchmark_tasks: {unknown} are not tasks of the train split; choose from {sorted(tasks)}"
        )
    out = []
    for name in names:
        specs = task_specs(tasks[name], "time")
        out.append({"name": name, "interval": int(tasks[name].get("interval", 50)),
                    **{k: specs[k] for k in ("cluster", "workload", "scenario")}})  # fmt: skip
    return out


def run_elastic(raw: dict) -> float:
    """Train an elastic learner (PPO, SAC or TD3); returns the best validation dollars to accuracy."""
    from dynamix_gym.elastic.training import ElasticTrainConfig, train_elastic

    kwargs = dict(raw["elastic"])
    kwargs["run_dir"] = to_absolute_path(str(raw["run_dir"]))
    if "eval_seeds" in kwargs:
        kwargs["eval_seeds"] = tuple(kwargs["eval_seeds"])
    result = train_elastic(ElasticTrainConfig(**kwargs), config_dict=raw)
    out = Path(kwargs["run_dir"]) / "train_summary.json"
    atomic_write_text(out, json.dumps(result, indent=2, default=str) + "\n")
    value = result["best_validation"]["dollars_to_accuracy"]
    log.info("best validation dollars to accuracy: %.4f (%s)", value, result["best_bundle"])
    return value


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
