"""``conf/train.yaml``'s schema: :class:`~dynamix_gym.learning.config.TrainConfig` plus the app's own
keys, registered in Hydra's ConfigStore as ``train_schema`` (Hydra's structured-config schema
pattern). ``conf/train.yaml`` lists it first in its defaults, so every trainer setting exists in the
composed config with the dataclass's default (given on the command line without ``+``; a
misspelt key or a value of the wrong type is an error at composition), and the YAML sets only
what differs from the library's defaults. Imported by ``experiments.train`` and by whoever
composes ``train`` in-process (``tests/conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from dynamix_gym.learning.config import TrainConfig

#: Keys of the composed ``train`` config that are the app's, not the trainer's.
APP_KEYS = ("task_name", "reward", "eval_benchmark_tasks", "elastic")


@dataclass
class TrainApp(TrainConfig):
    """:class:`TrainConfig` and the app's keys: its run name, the reward group (which goes into
    ``env.reward``), the benchmark tasks validation runs on (-> ``eval_tasks``), an elastic learner
    (``experiment=train_elastic_*``, run by ``experiments.train_elastic``)."""

    run_dir: str = "${hydra:runtime.output_dir}"
    task_name: str = "train"
    reward: dict[str, Any] = field(default_factory=dict)
    eval_benchmark_tasks: list[str] | None = None
    elastic: Any = None


ConfigStore.instance().store(name="train_schema", node=TrainApp)
