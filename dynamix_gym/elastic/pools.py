"""Pools by name: ``conf/pool/<name>.yaml`` (prices are data with their source and date there)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sim.pool import PoolSpec, pool_from_dict

#: Where named pools live (the Hydra config group of the same name).
POOL_DIR = Path(__file__).resolve().parents[2] / "conf" / "pool"


def pool_names() -> list[str]:
    return sorted(p.stem for p in POOL_DIR.glob("*.yaml"))


def get_pool(pool: str | Mapping[str, Any] | PoolSpec) -> PoolSpec:
    """A pool from a name under ``conf/pool``, a config mapping or a spec (returned unchanged).

    Raises:
        ValueError: an unknown pool name (listing the known ones) or an invalid pool config.
    """
    if isinstance(pool, PoolSpec):
        return pool
    if isinstance(pool, str):
        path = POOL_DIR / f"{pool}.yaml"
        if not path.is_file():
            raise ValueError(f"pool={pool!r} is not one of {pool_names()} (conf/pool/*.yaml)")
        with open(path) as fh:
            pool = yaml.safe_load(fh)
    if not isinstance(pool, Mapping):
        raise ValueError(f"pool must be a name, a mapping or a PoolSpec, got {type(pool).__name__}")
    return pool_from_dict(dict(pool))
