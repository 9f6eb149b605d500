"""deploy finetune=true: the bundle fine-tuned in the refitted simulator for a bounded time, kept
only if it beats the bundle on held-out simulated seeds of that profile."""

from __future__ import annotations

import json
import shutil

import pytest
from support import ROOT

import experiments.deploy_finetune as ft
from dynamix_gym.controllers.bundle import PPOController
from dynamix_gym.controllers.registry import make_controller
from dynamix_gym.learning.wallclock import WallClockLimit
from sim.faults import SCENARIOS

BUNDLE = ROOT / "results" / "fidelity" / "policy"  # trained on results/fidelity/profile (2 CPU ranks)
PROFILE = ROOT / "results" / "fidelity" / "profile"


@pytest.fixture(scope="module")
def bundle_ctl():
    return PPOController(path=BUNDLE)


@pytest.fixture
def refit(tmp_path):
    """A stand-in for the quick calibration's refit: the bundle's own training profile."""
    return shutil.copytree(PROFILE, tmp_path / "profile_refit")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_s": 0}, r"finetuning.max_s must lie in \(0, 3600\] seconds, got 0"),
        ({"timesteps": 0}, r"finetuning.timesteps must be an integer in \[1, 10000000\], got 0"),
        ({"learning_rate": 0.5}, r"finetuning.learning_rate must lie in \(0, 0.01\], got 0.5"),
        ({"seeds": []}, "finetuning.seeds must list 1-100 distinct integer seeds, got"),
        ({"budget": 1}, r"finetuning.budget is not a setting; finetuning takes \['max_s'"),
    ],
)
def test_bad_settings_name_the_field_and_range(values, message):
    with pytest.raises(ValueError, match=message):
        ft.Finetuning.from_config(values)


def test_finetune_needs_the_refit_and_a_bundle(bundle_ctl):
    with pytest.raises(ValueError, match=r"set calibrate\.quick=true"):
        ft.check_finetune(bundle_ctl, calibrating=False)
    with pytest.raises(
        ValueError, match=r"fine-tunes a PPO bundle \(policy=<bundle dir>\); the controller here is 'dlb'"
    ):
        ft.check_finetune(make_controller("dlb"), calibrating=True)
    assert ft.check_finetune(bundle_ctl, calibrating=True) is bundle_ctl


def test_the_run_is_the_bundles_own_on_the_refitted_profile_and_bounded(bundle_ctl, refit, tmp_path):
    settings = ft.Finetuning(max_s=30.0, timesteps=2048)
    cfg = ft.train_config(bundle_ctl.bundle, refit, settings, tmp_path / "run", seed=3)
    base = bundle_ctl.bundle.meta.config
    assert cfg.domain == {**base["domain"], "profile": str(refit)}
    assert cfg.finetune_from == str(BUNDLE) and cfg.max_train_s == 30.0 and cfg.total_timesteps == 2048
    assert (
        list(cfg.cluster_sizes) == [2, 2, 2, 2] == list(base["cluster_sizes"])
        and cfg.env["reward"] == base["reward"]
    )
    assert cfg.ppo["learning_rate"] == 3e-5 and cfg.resume is False and list(cfg.eval_seeds) == [1000]
    with pytest.raises(ValueError, match=r"finetuning.seeds \[1000\] are the bundle's validation seeds"):
        ft.train_config(bundle_ctl.bundle, refit, ft.Finetuning(seeds=(1000, 2000)), tmp_path / "r2", 0)


def test_a_redeployed_universal_bundle_finetunes_on_the_refits_cluster_under_its_deployed_split(
    refit, tmp_path
):
    """The universal bundle was trained over clusters of 2-16 under the balanced split and is deployed
    under balanced_cost: its fine-tuning runs on the refit's one cluster size, under the deployed split."""
    from dynamix_gym.learning.training import _env_of_bundle

    bundle = PPOController(path=ROOT / "results" / "policies" / "universal").bundle
    assert bundle.meta.config["cluster_sizes"] == [2, 4, 8, 16] and bundle.meta.split == "balanced_cost"
    cfg = ft.train_config(bundle, refit, ft.Finetuning(max_s=30.0, timesteps=2048), tmp_path / "run", seed=0)
    assert list(cfg.cluster_sizes) == [2, 2, 2, 2] and "split" not in cfg.env
    assert _env_of_bundle(cfg, bundle).env["split"] == "balanced_cost"


def test_the_wall_clock_stops_training_once_its_time_is_up():
    now = [0.0]
    limit = WallClockLimit(5.0, clock=lambda: now[0])
    limit._on_training_start()
    now[0] = 4.9
    assert limit._on_step() and not limit.stopped
    now[0] = 5.0
    assert not limit._on_step() and limit.stopped
    with pytest.raises(ValueError, match="max_train_s must be a finite number of seconds > 0, got 0"):
        WallClockLimit(0)


@pytest.mark.parametrize(
    ("tuned_tta", "kept"), [([9.0, 10.5], True), ([10.0, 10.5], False), ([10.0, 10.0], False)]
)
def test_the_fine_tuned_bundle_is_kept_only_if_faster_on_the_held_out_seeds(
    bundle_ctl, refit, tmp_path, monkeypatch, tuned_tta, kept
):
    copy = shutil.copytree(BUNDLE, tmp_path / "tuned")
    monkeypatch.setattr(ft, "train", lambda cfg, config_dict: {
        "final_bundle": str(copy), "timesteps": 7, "train_seconds": 1.0, "stopped_by_wall_clock": True,
    })  # fmt: skip

    def tta(controller, *_args):
        return [10.0, 10.0] if controller is bundle_ctl else list(tuned_tta)

    monkeypatch.setattr(ft, "held_out_tta", tta)
    settings = ft.Finetuning(seeds=(2000, 2001), progress=False)
    chosen, record = ft.finetune_in_refit(
        bundle_ctl, refit, SCENARIOS["static_hetero"], 10, settings, tmp_path, 0
    )
    assert record["kept"] is kept and (chosen is not bundle_ctl) is kept
    assert json.loads((tmp_path / ft.RECORD_FILE).read_text())["mean_tta_s"] == {
        "bundle": 10.0, "finetuned": sum(tuned_tta) / 2,
    }  # fmt: skip


def test_a_short_fine_tune_in_the_refitted_simulator_writes_its_bundle_and_verdict(
    bundle_ctl, refit, tmp_path
):
    settings = ft.Finetuning(max_s=60.0, timesteps=1024, seeds=(2000, 2001), progress=False)
    chosen, record = ft.finetune_in_refit(
        bundle_ctl, refit, SCENARIOS["static_hetero"], 20, settings, tmp_path, 0
    )
    assert record["train"]["timesteps"] >= 1024 or record["train"]["stopped_by_wall_clock"]
    tuned = PPOController(path=tmp_path / ft.RUN_DIR / "policy")
    assert tuned.bundle.meta.config["domain"]["profile"] == str(refit)  # it records where it was tuned
    assert tuned.env_options() == bundle_ctl.env_options()  # the deploy's env fits either
    means = record["mean_tta_s"]
    assert (
        record["kept"] == (means["finetuned"] < means["bundle"])
        and (chosen is not bundle_ctl) == record["kept"]
    )
    assert len(record["tta_s"]["bundle"]) == len(record["tta_s"]["finetuned"]) == 2
