"""The random baseline: a uniformly random local batch per worker, every interval."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController


class RandomController(BaseController):
    """Draws every worker's local batch uniformly from its [min_batch, max_batch] each interval.

    The floor any controller must clear. Every draw comes from the generator given at
    :meth:`reset` (``run_episode`` seeds it with the episode seed), so runs repeat exactly.

    Args:
        hold: intervals a drawn split is kept before the next draw (>= 1); 1 redraws every
            interval.
    """

    name: ClassVar[str] = "random"

    def __init__(self, hold: int = 5) -> None:
        if isinstance(hold, bool) or int(hold) != hold or hold < 1:
            raise ValueError(f"RandomController.hold must be an integer >= 1, got {hold!r}")
        self.hold = int(hold)

    def reset(self, spec, rng: np.random.Generator | None = None) -> None:
        super().reset(spec, rng)
        self._age = 0
        self._batches: np.ndarray | None = None

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        if self._batches is None or self._age >= self.hold:
            self._batches = self.rng.integers(self.spec.min_batch, self.spec.max_batch + 1)
            self._age = 0
        self._age += 1
        return self._batches.astype(np.float32), None
