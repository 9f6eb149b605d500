"""Hydra entry points of training run as subprocesses, as users run them."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from support import ROOT, run_app

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
    return run_app("experiments.train", *args, timeout=timeout)


@pytest.mark.integration
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


@pytest.mark.integration
def test_train_entry_point_writes_bundles(tmp_path):
    proc = run_train(*TINY, f"run_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("best", "policy"):
        assert (tmp_path / name / "bundle.json").is_file()
        assert (tmp_path / name / "model.zip").is_file()
    assert (tmp_path / "train_summary.json").is_file()


@pytest.mark.integration
@pytest.mark.slow
def test_every_train_experiment_preset_runs(tmp_path):
    """lightning-hydra-template's test_sweeps: every preset composes and trains briefly."""
    proc = run_train("-m", "experiment=glob(train_*)", *TINY, f"hydra.sweep.dir={tmp_path}", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(tmp_path.glob("*/policy/bundle.json"))) >= 4


def test_train_config_defaults_are_conf_train_yaml():
    """dynamix_gym.learning.training.TrainConfig mirrors conf/train.yaml: every default it has is
    the config's; its dict fields default to empty (the libraries' own), which the groups fill."""
    import dataclasses

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dynamix_gym.learning.training import TrainConfig

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = OmegaConf.to_container(compose("train"), resolve=False)
    for f in dataclasses.fields(TrainConfig):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue  # run_dir: required
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, dict):
            assert default == {} and isinstance(cfg[f.name], dict), f.name
        else:
            expected = list(default) if isinstance(default, tuple) else default
            assert cfg[f.name] == expected, (f.name, default, cfg[f.name])
