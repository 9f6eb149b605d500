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

from dynamix_gym.pipeline.controllers import PipelineController, dynpipe_start


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

    def reset(self, env) -> None:
        want, have = self.model.observation_space.shape, env.observation_space.shape
        if want != have:
            raise ValueError(
                f"the pipeline policy reads observations of shape {want}, the env gives {have}: a policy "
                "trained on dynamix/PipelineCluster-v0 needs move_gains=False, one of v1 move_gains=True"
            )
        super().reset(env)

    def predict(self, obs, info: dict[str, Any], deterministic: bool = True) -> tuple[np.ndarray, None]:
        action, _ = self.model.predict(obs, deterministic=deterministic, action_masks=self.env.action_masks())
        return np.asarray(action), None
