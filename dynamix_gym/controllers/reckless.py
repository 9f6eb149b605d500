"""A controller that wrecks training on purpose: the stress test of the guards (:mod:`sim.guards`).

Not a rival and not in the registry: it exists to provoke the collapse the guards must catch, on
the user's own job before they trust a policy on it (``python -m experiments.guard_campaign``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController


class RecklessController(BaseController):
    """Runs every worker at ``small`` for ``calm`` decisions, then jumps every worker to its memory
    cap and stays there: under a learning-rate rule that scales with the batch, a learning rate many
    times the tuned one.

    Args:
        small: the local batch of the calm decisions (>= 1, clipped to each worker's range).
        calm: decisions before the jump (>= 0).
    """

    name: ClassVar[str] = "reckless"
    action_mode: ClassVar[str] = "absolute"

    def __init__(self, small: int = 16, calm: int = 3) -> None:
        if isinstance(small, bool) or int(small) != small or small < 1:
            raise ValueError(f"RecklessController.small must be an integer >= 1, got {small!r}")
        if isinstance(calm, bool) or int(calm) != calm or calm < 0:
            raise ValueError(f"RecklessController.calm must be an integer >= 0, got {calm!r}")
        self.small, self.calm = int(small), int(calm)

    def reset(self, spec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self.decisions = 0

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True):
        self.decisions += 1
        if self.decisions <= self.calm:
            small = np.clip(
                np.full(self.spec.num_workers, self.small), self.spec.min_batch, self.spec.max_batch
            )
            return small.astype(np.float32), None
        return self.spec.max_batch.astype(np.float32), None
