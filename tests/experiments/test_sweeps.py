"""Hydra entry points of training run as subprocesses, as users run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "total_timesteps=300",
    "cluster_sizes=[2]",
    "ppo.n_steps=64",
    "ppo.batch_size=64",
    "ppo.n_epochs=1",
    "eval_every=1000000000",
    "checkpoint_every=1000000000",
    "eval_scenarios=[static_hetero]",
    "eval_seeds=[1000]",
    "eval_workers=2",
    "progress_bar=false",
    "+env.max_decisions=20",
]


def run_train(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "experiments.train", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_optuna_sweep_survives_a_failing_trial(tmp_path):
    proc = run_train(
        "-m",
        "hparams_search=reward_optuna",
        *TINY,
        "hydra.sweeper.n_trials=4",
        "reward.delta=choice(0.01,-1.0)",  # -1 is out of range: that trial raises
        f"hydra.sweep.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Failed experiment: reward.delta must be in [0, 1e+06], got -1.0" in proc.stdout + proc.stderr
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert result["best_params"]["reward.delta"] == 0.01
    assert result["best_value"] > 0


def test_train_entry_point_writes_bundles(tmp_path):
    proc = run_train(*TINY, f"run_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("best", "policy"):
        assert (tmp_path / name / "bundle.json").is_file()
        assert (tmp_path / name / "model.zip").is_file()
    assert (tmp_path / "train_summary.json").is_file()


@pytest.mark.slow
def test_every_train_experiment_preset_runs(tmp_path):
    """lightning-hydra-template's test_sweeps: every preset composes and trains briefly."""
    proc = run_train("-m", "experiment=glob(train_*)", *TINY, f"hydra.sweep.dir={tmp_path}", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(tmp_path.glob("*/policy/bundle.json"))) >= 4
