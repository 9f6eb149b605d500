"""What test modules share besides fixtures (those are in tests/conftest.py): the repository root
and running an entry point as a user runs it. Importable as ``support`` (pyproject.toml puts tests/
on pytest's pythonpath):

    from support import ROOT, run_app
    proc = run_app("experiments.evaluate", "controller=dlb", f"hydra.run.dir={tmp_path}")
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
#: The pretrained PPO bundle of results/headline (shipped in the repository).
HEADLINE_BUNDLE = ROOT / "results" / "headline" / "policy"
#: The universal bundle (observation schema 3, masked multiplicative steps; shipped).
UNIVERSAL_BUNDLE = ROOT / "results" / "policies" / "universal"


def docs_reference():
    """``docs/hooks/docs_reference.py``, the module ``make docs`` writes the reference pages with."""
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "docs" / "hooks" / "docs_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_python(
    args: Sequence[str],
    *,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
    cwd: str | Path = ROOT,
) -> subprocess.CompletedProcess:
    """``python args`` (this interpreter) in ``cwd``, output captured as text, unbuffered, with
    ``env`` added to this process's environment. It runs in its own process group: on timeout the
    whole group is killed (worker processes included) and the test fails with the end of stderr."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [sys.executable, *map(str, args)]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[1:])} ran past {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_app(
    module: str,
    *args: str,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
    cwd: str | Path = ROOT,
) -> subprocess.CompletedProcess:
    """``python -m module args`` (an entry point with its Hydra overrides): see :func:`run_python`."""
    return run_python(["-m", module, *args], timeout=timeout, env=env, cwd=cwd)


def ranks_alive() -> list[int]:
    """Worker ranks (spawned processes; not multiprocessing's resource tracker) still running."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


#: A training run of seconds (tests of the PPO training path).
TINY = dict(
    total_timesteps=1200,
    cluster_sizes=(2, 3),
    env={"interval": 50, "reward": {"kind": "time"}, "max_decisions": 40},
    ppo={"n_steps": 64, "batch_size": 160, "n_epochs": 1},
    policy_kwargs={"net_arch": [16, 16]},
    checkpoint_every=600,
    eval_every=10**9,  # only the final evaluation
    eval_scenarios=("static_hetero",),
    eval_seeds=(1000,),
    eval_workers=4,
    progress_bar=False,
)


def tiny(tmp_path: Path, **overrides):
    """A :class:`TrainConfig` of :data:`TINY` under ``tmp_path``, ``overrides`` on top."""
    from dynamix_gym.learning.training import TrainConfig

    return TrainConfig(run_dir=str(tmp_path / "run"), **{**TINY, **overrides})
