"""Small helpers shared by the experiment entry points."""

from __future__ import annotations

import hashlib
from pathlib import Path

import sim
from dynamix_gym.configs import plain
from sim.datafiles import atomic_write_text

__all__ = ["REPO_ROOT", "atomic_write_text", "describe_file", "plain", "shown"]

REPO_ROOT = Path(sim.__file__).resolve().parent.parent


def shown(path: str | Path) -> str:
    """``path`` relative to the repository when inside it (for reports), else absolute."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(resolved)


def describe_file(path: str | Path) -> dict[str, str]:
    """Where a source file is (see :func:`shown`) and its SHA-256, for provenance records."""
    return {"path": shown(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
