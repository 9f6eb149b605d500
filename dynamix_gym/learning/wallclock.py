"""A wall-clock bound on training: an SB3 callback that stops ``learn`` once its time is up."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from stable_baselines3.common.callbacks import BaseCallback


class WallClockLimit(BaseCallback):
    """Stops training (``_on_step`` returns False) once ``max_s`` seconds have passed since it
    started (or since ``started``, a ``clock()`` value: time spent before ``learn`` counts too);
    ``stopped`` says whether it did. The rollout under way when time is up ends at its
    next step, so the overshoot is one environment step of every env."""

    def __init__(
        self, max_s: float, clock: Callable[[], float] = time.perf_counter, started: float | None = None
    ) -> None:
        super().__init__()
        if (
            isinstance(max_s, bool)
            or not isinstance(max_s, int | float)
            or not math.isfinite(max_s)
            or max_s <= 0
        ):
            raise ValueError(f"max_train_s must be a finite number of seconds > 0, got {max_s!r}")
        self.max_s = float(max_s)
        self._clock = clock
        self._started = started
        self._t0 = 0.0 if started is None else float(started)
        self.stopped = False

    def _on_training_start(self) -> None:
        if self._started is None:
            self._t0 = self._clock()

    def _on_step(self) -> bool:
        if self._clock() - self._t0 >= self.max_s:
            self.stopped = True
            return False
        return True
