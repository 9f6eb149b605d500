"""The learned pipeline policy: sb3-contrib's MaskablePPO behind the pipeline controllers' interface.

Its episodes start from DynPipe's plan (T(S) x W(S) over the stage counts, PipeDream's DP for the
partition: :meth:`~dynamix_gym.pipeline.controllers.DynPipeController.start_options`), the warm
start it was trained from (``python -m experiments.pipeline_train``); from there it moves the
boundaries and the micro-batch count, reading the env's observation and masks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dynamix_gym.pipeline.controllers import PipelineController
from dynamix_gym.pipeline.planner import dynpipe_plan


def dynpipe_start(env, seed: int) -> dict[str, Any]:
    """DynPipe's start plan of the episode ``seed`` (the env's ``start_planner`` while training)."""
    m = env.micro_batch_set[len(env.micro_batch_set) // 2]
    base = env.simulator_for(seed)
    S, sizes, _ = dynpipe_plan(
        lambda k: env.simulator_for(seed, stages=k), base.cluster.num_workers, base.model.num_blocks, m,
        env.max_stages,
    )  # fmt: skip
    return {"stages": S, "sizes": sizes, "micro_batches": m}


class PolicyController(PipelineController):
    """A trained MaskablePPO model (a zip written by ``experiments.pipeline_train``)."""

    name = "policy"

    def __init__(self, path: str | Path) -> None:
        from sb3_contrib import MaskablePPO

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"no pipeline policy at {path}; train one with python -m experiments.pipeline_train"
            )
        self.model = MaskablePPO.load(path, device="cpu")

    def start_options(self, env, seed: int) -> dict[str, Any]:
        return dynpipe_start(env, seed)

    def predict(self, obs, info: dict[str, Any], deterministic: bool = True) -> tuple[np.ndarray, None]:
        action, _ = self.model.predict(obs, deterministic=deterministic, action_masks=self.env.action_masks())
        return np.asarray(action), None
