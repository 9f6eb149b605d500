"""The controller interface shared by evaluation, PPO bundles and deployment to real training."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from dynamix_gym.backend import BackendSpec


@runtime_checkable
class Controller(Protocol):
    """Decides every worker's local batch once per interval.

    ``predict`` has Stable-Baselines3's shape, so a loaded SB3 policy is just another controller.
    ``info`` is the env's info dict: ``info["report"]`` is the last
    :class:`~sim.report.IntervalReport` (every backend provides it) and ``info["local_batches"]``
    the batches in force. Only controllers with ``uses_truth = True`` (the oracle) may read
    ``report.truth``, which exists in simulation alone.
    """

    name: str
    action_mode: str  # the env action mode the controller emits: "delta" | "absolute" | "continuous"
    uses_truth: bool

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None: ...

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]: ...


class BaseController:
    """Convenience base: stores the backend spec and a generator at reset."""

    name: ClassVar[str] = "base"
    action_mode: ClassVar[str] = "absolute"
    uses_truth: ClassVar[bool] = False

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        self.spec = spec
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        raise NotImplementedError

    def clip(self, batches: np.ndarray) -> np.ndarray:
        """Whole batches within every worker's [min, max]."""
        return np.clip(np.rint(batches), self.spec.min_batch, self.spec.max_batch).astype(np.int64)
