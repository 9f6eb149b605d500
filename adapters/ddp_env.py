"""``dynamix/RealDDP-v0``: the unchanged :class:`HeteroClusterEnv` over a :class:`DDPBackend`."""

from __future__ import annotations

import logging
import multiprocessing as mp
import re
import sys
from pathlib import Path
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
    "split",
    "split_tolerance",
)

#: What to do when the workers cannot start because the main module builds the env unguarded.
MAIN_GUARD_HINT = (
    "dynamix/RealDDP-v0 starts its DDP workers with the 'spawn' method, and a spawned process "
    're-imports the main module: build the env (and run it) under `if __name__ == "__main__":` '
    "in {where}, or the workers re-run it and die while starting (exit code 1)"
)
_GUARD = re.compile(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:""", re.MULTILINE)


def check_main_guard() -> None:
    """Fail early, with what to do, where :class:`DDPBackend`'s spawned workers would die.

    In a worker that is importing the main module (spawn's bootstrap), building the env again is
    the unguarded script re-running: say so there (its stderr is the user's). In the parent, a
    main script with no ``if __name__ == "__main__":`` at all will have its workers do just that.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(MAIN_GUARD_HINT.format(where="the main module"))
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path and Path(path).suffix == ".py" and Path(path).is_file():
        if not _GUARD.search(Path(path).read_text(errors="replace")):
            raise RuntimeError(MAIN_GUARD_HINT.format(where=path))


def make_real_ddp_env(
    *, cluster: str | ClusterSpec | None = None, workload: Any = None, **kwargs: Any
) -> HeteroClusterEnv:
    """Build the real backend from ``kwargs`` and return the same env class the simulator uses.

    ``gymnasium.make("dynamix/RealDDP-v0", workers=2)`` trains a small CNN on scikit-learn's digits
    with two gloo ranks on CPU; ``dataset="pystdlib", model="transformer", target_val_loss=2.3``
    trains a byte-level language model instead, whose falling validation loss the env sees as its
    quality (:mod:`adapters.tasks`). Worker processes start at the first ``reset`` and stop at ``close``.

    Args:
        cluster: with ``emulate="cluster"``, the ranks emulate this cluster's GPU types (one rank
            per GPU: ``workers`` defaults to its size); otherwise it is ignored.
        workload: accepted for signature compatibility with the simulated env and ignored: the real
            workload is ``model`` on ``dataset``.
        **kwargs: the env's own arguments (:data:`ENV_KWARGS`) and
            :class:`adapters.config.RealDDPConfig` fields. ``time_budget_s`` sets both the
            backend's budget and the env's truncation.
    """
    check_main_guard()
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
