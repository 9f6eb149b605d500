"""Small helpers shared by the experiment entry points."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

import sim
from dynamix_gym.configs import plain
from sim.datafiles import atomic_write_text

__all__ = [
    "REPO_ROOT",
    "atomic_write_text",
    "describe_file",
    "hydra_app",
    "plain",
    "shown",
    "write_profile_copy",
]

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


def hydra_app(
    config_name: str, run: Callable[[DictConfig], Mapping[str, Any]], score: str, spec: Any = None
) -> Callable[[], Any]:
    """An app's entry point: Hydra composes ``conf/<config_name>.yaml`` with the command line, and
    ``main()`` returns ``run(cfg)[score]`` (a sweeper's objective). ``spec``: the app module's
    ``__spec__``, whose name Hydra gives the job (``dynamix-gym`` finds apps by ``main = hydra_app(``)."""

    def main(cfg: DictConfig) -> Any:
        return run(cfg)[score]

    if spec is not None:
        main.__module__ = spec.name
    return hydra.main(version_base=None, config_path=str(REPO_ROOT / "conf"), config_name=config_name)(main)


def write_profile_copy(
    src: Path, out: Path, convergence: Any, generated_by: str, edit: Callable[[Path], Any] | None = None
) -> Any:
    """A copy of the profile directory ``src`` at ``out`` with its convergence model replaced by
    ``convergence`` (a :class:`sim.convergence.ConvergenceParams`) and ``edit(copy)`` applied, put in
    place only once the simulator loads it: built beside ``out`` first, so that a failure leaves
    ``out`` as it was and nothing half-written. Returns what ``edit`` returned (None without one)."""
    # imported here: every app imports this module, and the profile loader costs ~0.15 s to import
    from sim.convergence import CONVERGENCE_MODELS_FILE
    from sim.profile import load_profile

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    doc = {"generated_by": generated_by, "models": [asdict(convergence)]}
    (tmp / CONVERGENCE_MODELS_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    result = edit(tmp) if edit is not None else None
    load_profile(tmp)  # refuse to leave a profile the simulator cannot load
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return result
