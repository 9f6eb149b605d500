"""The controller interface shared by evaluation, PPO bundles and deployment to real training."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from sim.protocol import BackendSpec


@runtime_checkable
class Controller(Protocol):
    """Decides every worker's local batch once per interval.

    ``predict`` has Stable-Baselines3's shape, so a loaded SB3 policy is just another controller.
    ``info`` is the env's info dict: ``info["report"]`` is the last
    :class:`~sim.protocol.IntervalReport` (every backend provides it) and ``info["local_batches"]``
    the batches in force. Only controllers with ``uses_truth = True`` (the oracle) may read
    ``report.truth`` and ask ``info["ground_truth"]`` (the simulator's noise-free models,
    :class:`~sim.protocol.GroundTruth`), which exist in simulation alone.
    """

    name: str
    action_mode: str  # the env action mode the controller emits: "delta" | "absolute" | "continuous"
    uses_truth: bool

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None: ...

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]: ...


class BaseController:
    """Convenience base: stores the backend spec and a generator at reset, and declares the optional
    hooks every caller (:func:`~dynamix_gym.evaluation.run_episode`, the apps, the drop-in) calls,
    with defaults that do nothing: override them where a controller needs them.

    * :meth:`env_options`: env keyword arguments besides the action mode (a bundle: its
      observation schema and action set);
    * :meth:`initial_batches`: the warm-up interval's batches (None: the backend's initial batch);
    * :meth:`check_env`: refuse an env the controller cannot drive (a bundle: another action set);
    * :meth:`prepare`: see the episode's env and seed before it starts (the hindsight limit
      searches replays of it);
    * :attr:`search_log`: what a planning controller searched (the hindsight limit's), or None.
    """

    name: ClassVar[str] = "base"
    action_mode: ClassVar[str] = "absolute"
    uses_truth: ClassVar[bool] = False
    search_log: dict[str, Any] | None = None

    def env_options(self) -> dict[str, Any]:
        """Env keyword arguments this controller needs besides its ``action_mode``."""
        return {}

    def initial_batches(self, spec: BackendSpec) -> np.ndarray | None:
        """The warm-up interval's local batches, or None for the backend's initial batch."""
        return None

    def check_env(self, env: Any) -> None:
        """Raise if this controller cannot drive ``env`` (the unwrapped env)."""
        return None

    def prepare(self, env: Any, seed: int) -> None:
        """Called with the episode's env and seed before its reset."""
        return None

    def episode_summary(self) -> dict[str, Any]:
        """Fields the controller adds to an episode's summary (:func:`dynamix_gym.evaluation.run_episode`
        calls it at the end; none by default)."""
        return {}

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        self.spec = spec
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def predict(
        self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True
    ) -> tuple[np.ndarray, None]:
        raise NotImplementedError

    def check_global_batch(self, field: str, value: int) -> int:
        """``value`` (a global batch named ``field``) if the backend's workers can run it.

        Raises:
            ValueError: naming ``field`` and the feasible range [sum of min_batch, sum of max_batch].
        """
        lo, hi = int(self.spec.min_batch.sum()), int(self.spec.max_batch.sum())
        if not lo <= value <= hi:
            raise ValueError(
                f"{type(self).__name__}.{field} must lie in [{lo}, {hi}] (the sum of the workers' "
                f"min_batch and max_batch on this backend), got {value}"
            )
        return int(value)

    def fixed_global_batch(self, global_batch: int | None, global_fraction: float) -> int:
        """The global batch a fixed-M rule holds: ``global_batch`` if given (checked against the
        backend's range), else ``global_fraction`` of the workers' memory
        (:func:`memory_global_batch`)."""
        if global_batch is None:
            return memory_global_batch(self.spec, global_fraction)
        return self.check_global_batch("global_batch", global_batch)

    def clip(self, batches: np.ndarray) -> np.ndarray:
        """Whole batches within every worker's [min, max]."""
        return np.clip(np.rint(batches), self.spec.min_batch, self.spec.max_batch).astype(np.int64)


def memory_global_batch(spec: BackendSpec, fraction: float) -> int:
    """The global batch ``fraction`` of the cluster's memory capacity, a workload-relative default:

        M = max(round(fraction * sum_i max_batch_i), sum_i min_batch_i)

    ``max_batch`` is every worker's memory cap (what AdaptDL asks its user for as the largest
    batch), so the rule scales with the workload and the cluster rather than with CIFAR-10.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction of the memory capacity must be in (0, 1], got {fraction!r}")
    return max(round(fraction * float(spec.max_batch.sum())), int(spec.min_batch.sum()))


def check_fraction(owner: str, field: str, value: float) -> float:
    """``value`` as a float if it lies in (0, 1]; else a ValueError naming ``owner.field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise ValueError(f"{owner}.{field} must be in (0, 1], got {value!r}")
    return float(value)


#: The hooks of a controller that does not derive from BaseController (a bare Controller): the defaults.
_NO_HOOKS = BaseController()


def hooks(controller: Controller) -> BaseController:
    """``controller`` where it derives from :class:`BaseController` (whose hooks it declares), else
    an object with the default hooks: a bare :class:`Controller` has none of its own."""
    return controller if isinstance(controller, BaseController) else _NO_HOOKS


def start_options(controller: Controller, spec: Any) -> dict[str, Any] | None:
    """Reset options for a controller that picks the warm-up interval's batches itself
    (:meth:`BaseController.initial_batches` returning an array; ``None``: the backend's initial batch)."""
    initial = hooks(controller).initial_batches(spec)
    return None if initial is None else {"initial_batches": initial}


def decided_without_policy(controller: Controller) -> bool:
    """Whether the controller's last ``predict`` kept the batches because its policy did not decide
    (a remote policy that refused the job or did not answer: ``last_without_policy``); ``False`` for
    a controller that always decides itself."""
    return bool(getattr(controller, "last_without_policy", False))


def env_options(controller: Controller) -> dict[str, Any]:
    """Env keyword arguments a controller needs besides its ``action_mode``
    (:meth:`BaseController.env_options`; a policy bundle: its observation schema and action set)."""
    return dict(hooks(controller).env_options())
