"""Generated pipelines and the ``pipeline`` split (train / test) in the benchmark's style.

A world: a model of uneven blocks (:func:`sim.pipeline.model.generate_model`), a cluster of 2-8
workers of 1-3 GPU types, a stage count (one or two replicas per stage, 2-8 stages) and a fault
scenario. The test split holds out model shapes (more uneven blocks) and GPU types (RTX 2080 Ti,
Quadro RTX 6000 never appear in training), and its seeds are disjoint from the train split's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from sim.cluster import mixed_cluster
from sim.faults import get_scenario
from sim.pipeline.model import ModelShape, generate_model

TRAIN_GPUS = ("T4", "V100", "A100")
TEST_GPUS = ("T4", "V100", "A100", "RTX2080Ti", "QuadroRTX6000")
SCENARIOS = ("interference", "throttle", "jitter", "mixed", "loss_rejoin")


@dataclass(frozen=True)
class SplitSpec:
    gpus: tuple[str, ...]
    shape: ModelShape
    seed_offset: int  # world seeds of the split start here
    require_held_out_gpu: bool = False


SPLITS = {
    "train": SplitSpec(TRAIN_GPUS, ModelShape(num_blocks=(8, 64), unevenness=(0.2, 0.8)), 0),
    "test": SplitSpec(TEST_GPUS, ModelShape(num_blocks=(8, 64), unevenness=(0.8, 1.2)), 100_000, True),
}


def make_world(rng: np.random.Generator, split: str = "train", scenario: str | None = None) -> dict[str, Any]:
    """A world of ``split`` (every draw from ``rng``); ``scenario`` None draws one of :data:`SCENARIOS`."""
    spec = SPLITS[split]
    workers = int(rng.choice([2, 4, 6, 8]))
    n_types = int(rng.integers(1, min(3, workers) + 1))
    types = list(rng.choice(spec.gpus, size=n_types, replace=False))
    if spec.require_held_out_gpu and not set(types) - set(TRAIN_GPUS):
        types[0] = str(rng.choice([g for g in spec.gpus if g not in TRAIN_GPUS]))
    counts = np.ones(n_types, dtype=int) + rng.multinomial(workers - n_types, np.ones(n_types) / n_types)
    cluster = mixed_cluster({str(g): int(c) for g, c in zip(types, counts, strict=True)})
    stages = workers if workers <= 8 and rng.random() < 0.7 else workers // 2
    stages = max(stages, 2)
    model = generate_model(rng, spec.shape)
    name = scenario if scenario is not None else str(rng.choice(SCENARIOS))
    return {"cluster": cluster, "model": model, "scenario": get_scenario(name), "stages": stages}


def world_fn(split: str = "train", scenario: str | None = None):
    """A ``WorldFn`` for ``PipelineClusterEnv(world=...)``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    return partial(make_world, split=split, scenario=scenario)


def task_seeds(split: str, count: int) -> list[int]:
    """The episode seeds of a split: the world and its faults are drawn from each."""
    return [SPLITS[split].seed_offset + i for i in range(count)]
