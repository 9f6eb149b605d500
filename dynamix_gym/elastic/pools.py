"""Pools by name: ``sim/data/pool/<name>.yaml``, shipped with the package (prices are data with their
source and date there)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sim.datafiles import data_path
from sim.pool import PoolSpec, pool_from_dict

#: Where named pools live: package data of ``sim`` (an installed wheel has them too).
POOL_DIR: Path = data_path("pool")


def pool_names() -> list[str]:
    return sorted(p.stem for p in POOL_DIR.glob("*.yaml"))


def get_pool(pool: str | Mapping[str, Any] | PoolSpec) -> PoolSpec:
    """A pool from a name under ``sim/data/pool``, a config mapping or a spec (returned unchanged).

    Raises:
        ValueError: an unknown pool name (listing the known ones) or an invalid pool config.
    """
    if isinstance(pool, PoolSpec):
        return pool
    if isinstance(pool, str):
        path = POOL_DIR / f"{pool}.yaml"
        if not path.is_file():
            raise ValueError(f"pool={pool!r} is not one of {pool_names()} (sim/data/pool/*.yaml)")
        with open(path) as fh:
            pool = yaml.safe_load(fh)
    if not isinstance(pool, Mapping):
        raise ValueError(f"pool must be a name, a mapping or a PoolSpec, got {type(pool).__name__}")
    return pool_from_dict(dict(pool))
