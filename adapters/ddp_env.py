"""``dynamix/RealDDP-v0``: the unchanged :class:`HeteroClusterEnv` over a :class:`DDPBackend`."""

from __future__ import annotations

import logging
from typing import Any

from adapters.ddp_backend import DDPBackend
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from sim.cluster import ClusterSpec, get_cluster

log = logging.getLogger(__name__)

#: Keyword arguments that configure the env itself; all others configure the backend
#: (:class:`adapters.config.RealDDPConfig`).
ENV_KWARGS = (
    "reward",
    "interval",
    "action_mode",
    "action_set",
    "max_decisions",
    "time_budget_s",
    "window",
    "obs_schema",
)


def make_real_ddp_env(
    *, cluster: str | ClusterSpec | None = None, workload: Any = None, **kwargs: Any
) -> HeteroClusterEnv:
    """Build the real backend from ``kwargs`` and return the same env class the simulator uses.

    ``gymnasium.make("dynamix/RealDDP-v0", workers=2)`` trains a small CNN on scikit-learn's digits
    with two gloo ranks on CPU. Worker processes start at the first ``reset`` and stop at ``close``.

    Args:
        cluster: with ``emulate="cluster"``, the ranks emulate this cluster's GPU types (one rank
            per GPU: ``workers`` defaults to its size); otherwise it is ignored.
        workload: accepted for signature compatibility with the simulated env and ignored: the real
            workload is ``model`` on ``dataset``.
        **kwargs: the env's own arguments (:data:`ENV_KWARGS`) and
            :class:`adapters.config.RealDDPConfig` fields. ``time_budget_s`` sets both the
            backend's budget and the env's truncation.
    """
    env_kwargs = {k: kwargs.pop(k) for k in ENV_KWARGS if k in kwargs}
    if env_kwargs.get("time_budget_s") is not None:
        kwargs.setdefault("time_budget_s", float(env_kwargs["time_budget_s"]))
    if kwargs.get("emulate") == "cluster":
        if cluster is None:
            raise ValueError("emulate='cluster' needs a cluster (a preset name or a ClusterSpec)")
        spec = get_cluster(cluster)
        if kwargs.get("workers") not in (None, spec.num_workers):
            raise ValueError(
                f"workers={kwargs['workers']} but cluster {spec.name!r} has {spec.num_workers} GPUs to emulate"
            )
        kwargs["workers"] = spec.num_workers
        kwargs["emulate"] = spec.gpu_types
    elif cluster is not None:
        log.debug("cluster %r ignored: the real backend runs `workers` native ranks", cluster)
    if kwargs.get("workers") is None:
        kwargs.pop("workers", None)
    if workload is not None:
        log.debug(
            "workload %r ignored: the real backend trains model=%s on dataset=%s",
            workload,
            kwargs.get("model", "cnn"),
            kwargs.get("dataset", "digits"),
        )
    backend = DDPBackend(**kwargs)
    return HeteroClusterEnv(backend=backend, **env_kwargs)
