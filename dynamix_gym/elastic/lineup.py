"""The elastic controllers a comparison runs, built from config entries (``conf/elastic.yaml``'s
``controllers``): fixed allocations (held from the start, or reached from the pool's start), the
rules of :mod:`dynamix_gym.elastic.baselines`, and learned bundles."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dynamix_gym.elastic.baselines import FixedAllocation, make_elastic_controller
from dynamix_gym.elastic.training import load_elastic_bundle
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv

log = logging.getLogger(__name__)

Resolve = Callable[[str], str]


def _same(path: str) -> str:
    return path


def entry_controller(
    spec: dict[str, Any], env_kwargs: dict[str, Any], lr_multiplier: float = 1.0, resolve: Resolve = _same
) -> tuple[Any, dict[str, Any]]:
    """(controller, env kwargs) of one entry of ``controllers``; a baseline runs at the entry's
    ``lr_multiplier`` or else ``lr_multiplier`` (a learned policy picks its own)."""
    kind = spec["kind"]
    kw = {**env_kwargs, **spec.get("env", {})}
    lr = float(spec.get("lr_multiplier", lr_multiplier))
    if kind == "fixed":
        counts = dict(spec["counts"])
        return FixedAllocation(counts, label=spec["name"]).set_lr(lr), {**kw, "initial_allocation": counts}
    if kind == "fixed_target":  # the same target, reached from the pool's initial allocation
        return FixedAllocation(dict(spec["counts"]), label=spec["name"]).set_lr(lr), kw
    if kind == "learned":
        algo_form = {"ppo": "multidiscrete", "sac": "box", "td3": "box"}[spec["algo"]]
        kw = {**kw, "action_form": algo_form}
        return load_elastic_bundle(resolve(spec["bundle"]), ElasticClusterEnv(**kw)), kw
    return make_elastic_controller(kind, lr_multiplier=lr, **spec.get("params", {})), kw


def lineup(
    specs: list[dict[str, Any]],
    env_kwargs: dict[str, Any],
    lr_multiplier: float = 1.0,
    resolve: Resolve = _same,
):
    """(entry, controller, env kwargs) of every entry of ``specs`` (see :func:`entry_controller`); a
    learned entry whose bundle is missing is skipped with a warning. ``resolve`` maps a bundle's
    path as written (an app passes Hydra's ``to_absolute_path``)."""
    for spec in specs:
        if spec["kind"] == "learned" and not Path(resolve(spec["bundle"])).is_dir():
            log.warning("skipping %s: no bundle at %s", spec["name"], spec["bundle"])
            continue
        yield (spec, *entry_controller(spec, env_kwargs, lr_multiplier, resolve))
