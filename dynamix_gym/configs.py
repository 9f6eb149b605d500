"""Hydra / OmegaConf nodes as plain Python, for library code that takes a config's parts."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def plain(node: Any) -> Any:
    """A Hydra/OmegaConf node as plain Python containers (anything else unchanged)."""
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node, resolve=True)
    return node
