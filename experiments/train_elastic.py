"""Train an elastic learner (PPO, SAC or TD3) on dynamix/ElasticCluster-v0.

    python -m experiments.train_elastic learner=ppo                     # conf/learner/ppo.yaml
    python -m experiments.train_elastic learner=sac total_timesteps=30000 seed=101
    python -m experiments.train experiment=train_elastic_ppo           # the same learner, as before

The settings are :class:`dynamix_gym.elastic.training.ElasticTrainConfig`'s fields; the composed
configuration is checked against them, so a misspelt or foreign key (``ppo``, ``domain``) is an
error naming it. Writes ``<run_dir>/best`` (the bundle with the lowest validation dollars plus value
of time), ``<run_dir>/policy`` and ``train_summary.json``; returns the best validation dollars to
accuracy.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from experiments.common import atomic_write_text

log = logging.getLogger(__name__)

#: Keys of conf/train_elastic.yaml that are the app's, not the trainer's.
APP_KEYS = ("task_name",)


def run_elastic(settings: dict[str, Any], config_dict: dict[str, Any] | None = None) -> float:
    """Train the learner ``settings`` describe (ElasticTrainConfig's fields; ``run_dir`` relative to
    the launch directory); returns the best validation dollars to accuracy."""
    from dynamix_gym.elastic.training import ElasticTrainConfig, train_elastic
    from dynamix_gym.learning.config import structured

    settings = {**settings, "run_dir": to_absolute_path(str(settings["run_dir"]))}
    cfg = structured(ElasticTrainConfig, settings, "train_elastic")
    result = train_elastic(cfg, config_dict=config_dict if config_dict is not None else settings)
    out = Path(cfg.run_dir) / "train_summary.json"
    atomic_write_text(out, json.dumps(result, indent=2, default=str) + "\n")
    value = result["best_validation"]["dollars_to_accuracy"]
    log.info("best validation dollars to accuracy: %.4f (%s)", value, result["best_bundle"])
    return value


@hydra.main(version_base=None, config_path="../conf", config_name="train_elastic")
def main(cfg: DictConfig) -> float:
    raw = OmegaConf.to_container(cfg, resolve=True)
    return run_elastic({k: v for k, v in raw.items() if k not in APP_KEYS}, config_dict=raw)


if __name__ == "__main__":
    main()
