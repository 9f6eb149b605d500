"""``dynamix/RealDDP-v0``: the unchanged :class:`HeteroClusterEnv` over a :class:`DDPBackend`."""

from __future__ import annotations

from typing import Any

from adapters.ddp_backend import DDPBackend
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv

#: Keyword arguments that configure the env itself; all others configure the backend
#: (:class:`adapters.config.RealDDPConfig`).
ENV_KWARGS = ("reward", "interval", "action_mode", "action_set", "max_decisions", "time_budget_s", "window")


def make_real_ddp_env(**kwargs: Any) -> HeteroClusterEnv:
    """Build the real backend from ``kwargs`` and return the same env class the simulator uses.

    ``gymnasium.make("dynamix/RealDDP-v0", workers=2)`` trains a small CNN on scikit-learn's digits
    with two gloo ranks on CPU. Worker processes start at the first ``reset`` and stop at ``close``.
    ``time_budget_s`` sets both the backend's budget and the env's truncation.
    """
    env_kwargs = {k: kwargs.pop(k) for k in ENV_KWARGS if k in kwargs}
    if "time_budget_s" in env_kwargs and env_kwargs["time_budget_s"] is not None:
        kwargs.setdefault("time_budget_s", float(env_kwargs["time_budget_s"]))
    backend = DDPBackend(**kwargs)
    return HeteroClusterEnv(backend=backend, **env_kwargs)
