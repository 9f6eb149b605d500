"""Hydra entry points of training run as subprocesses, as users run them."""

from __future__ import annotations

import dataclasses
import re
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


def _composed_train(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("train", overrides=list(overrides))
    with open_dict(cfg):
        cfg.run_dir = "run"  # ${hydra:runtime.output_dir} outside a run
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize(
    "preset", [None, *sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("train_*.yaml"))]
)
def test_every_train_preset_is_a_train_config(preset):
    """conf/train.yaml with each preset composes into a checked TrainConfig (the elastic presets
    into an ElasticTrainConfig): no key the trainer would ignore."""
    from dynamix_gym.elastic.training import ElasticTrainConfig
    from dynamix_gym.learning.config import check_train_config, structured
    from experiments.train import train_config

    raw = _composed_train(*([f"experiment={preset}"] if preset else []))
    if raw.get("elastic"):
        cfg = structured(ElasticTrainConfig, {**raw["elastic"], "run_dir": "run"}, "train_elastic")
        assert cfg.seed >= 100 and cfg.algo in ("ppo", "sac", "td3")
        return
    cfg = train_config({**raw, "eval_benchmark_tasks": None})
    check_train_config(cfg)
    if preset is None:  # every setting can be given on the command line without `+`
        assert {f.name for f in dataclasses.fields(cfg)} <= set(raw)
    assert cfg.env["reward"] == raw["reward"] and cfg.ppo == raw["ppo"]


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("+total_timestep=5", r"train\.total_timestep"),
        ("+expert_pretrain.episods=5", r"expert_pretrain\.episods"),
        ("+ppo.n_step=64", r"ppo\.n_step is not a keyword of PPO"),
        ("+domain.scenarioz=[throttle]", r"domain\.scenarioz"),
        ("+env.intervall=5", r"env\.intervall is not a keyword of HeteroClusterEnv"),
    ],
)
def test_a_misspelt_train_key_is_an_error_naming_it(override, match):
    from dynamix_gym.learning.config import check_train_config
    from experiments.train import train_config

    raw = _composed_train("experiment=train_quick", override)
    with pytest.raises(ValueError, match=match):
        check_train_config(train_config(raw))


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("seed=zero", r"'zero' of type 'str' could not be converted to Integer"),
        ("total_timestep=5", "total_timestep"),
    ],
)
def test_train_schema_refuses_a_wrong_value_or_key_when_composing(override, match):
    """conf/train.yaml's schema (experiments/train_schema.py): a setting of the wrong type, or a key
    that is not one given without ``+``, fails composition naming it, before anything runs."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        _composed_train(override)
    assert re.search(match, str(err.value) + str(err.value.__cause__))


@pytest.mark.integration
def test_elastic_learners_have_their_own_app_and_refuse_the_ppo_trainers_settings(tmp_path):
    """experiments.train experiment=train_elastic_* used to drop seed, total_timesteps, ppo and
    domain silently; now such a command-line setting is refused, and experiments.train_elastic
    takes the learner's settings at the top level, checked."""
    proc = run_train("experiment=train_elastic_ppo", "seed=3", f"hydra.run.dir={tmp_path / 'a'}", timeout=120)
    assert proc.returncode != 0
    assert "seed is a setting of the cluster PPO trainer" in proc.stderr
    proc = run_app(
        "experiments.train_elastic",
        "learner=sac",
        "+total_timestep=5",
        f"hydra.run.dir={tmp_path / 'b'}",
        timeout=120,
    )
    assert proc.returncode != 0 and "total_timestep" in proc.stderr
