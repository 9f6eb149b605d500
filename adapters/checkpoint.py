"""Atomic checkpoints: a run resumed after a crash continues from the last complete one.

Layout under ``checkpoint_dir``::

    interval-000012/worker.pt        model, optimiser, data-schedule position (written by rank 0)
    interval-000012/coordinator.pt   clocks, batches, noise-scale estimate, extra state (controller)
    latest.json                      {"interval": 12, "path": "interval-000012"}

Each file is written to a temporary name and ``os.replace``d; ``latest.json`` is replaced last, so a
crash at any moment leaves ``latest.json`` naming a complete checkpoint. Older checkpoints than the
last ``keep`` are deleted after the pointer moves.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from sim.datafiles import atomic_write

LATEST = "latest.json"


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    return atomic_write(path, lambda fh: torch.save(obj, fh), mode="wb")


def _atomic_write_json(path: Path, obj: dict) -> None:
    atomic_write(path, lambda fh: json.dump(obj, fh))


def checkpoint_path(root: str | Path, interval: int) -> Path:
    return Path(root) / f"interval-{interval:06d}"


def commit(root: str | Path, interval: int, keep: int = 2) -> None:
    """Point ``latest.json`` at the (complete) checkpoint of ``interval``; prune older ones."""
    root = Path(root)
    _atomic_write_json(
        root / LATEST, {"interval": int(interval), "path": checkpoint_path(root, interval).name}
    )
    done = sorted(p for p in root.glob("interval-*") if p.is_dir())
    for old in done[: max(len(done) - keep, 0)]:
        if old.name != checkpoint_path(root, interval).name:
            shutil.rmtree(old, ignore_errors=True)


def latest(root: str | Path | None) -> Path | None:
    """The folder of the last complete checkpoint under ``root``, or ``None``."""
    if root is None:
        return None
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    with open(pointer) as fh:
        folder = Path(root) / json.load(fh)["path"]
    if not (folder / "worker.pt").exists() or not (folder / "coordinator.pt").exists():
        raise RuntimeError(
            f"checkpoint {folder} named by {pointer} is incomplete (worker.pt / coordinator.pt)"
        )
    return folder


def load(path: str | Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=False)
