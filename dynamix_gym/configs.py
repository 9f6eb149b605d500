"""Hydra / OmegaConf nodes as plain Python, for library code that takes a config's parts."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

T = TypeVar("T")


def plain(node: Any) -> Any:
    """A Hydra/OmegaConf node as plain Python containers (anything else unchanged)."""
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node


def settings(cls: type[T], node: Any, group: str, sequences: tuple[str, ...] = ()) -> T:
    """The dataclass ``cls`` from a config node (``None``: its defaults): a key that is not one of its
    fields is an error naming it (``<group>.<key> is not a setting``); ``sequences`` are the fields
    held as tuples (a list in the config, ``None`` an empty tuple). ``cls`` checks the values."""
    values = dict(plain(node) or {})
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{group}.{unknown[0]} is not a setting; {group} takes {known}")
    for name in sequences:
        if name in values:
            values[name] = tuple(values[name] or ())
    return cls(**values)
