"""deploy finetune=true: the bundle fine-tuned in the refitted simulator for a bounded time, kept
only if it beats the bundle on held-out simulated seeds of that profile."""

from __future__ import annotations

import json
import shutil

import numpy as np
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
        (
            {"method": "ppo", "timesteps": 0},
            r"finetuning.timesteps must be an integer in \[1, 10000000\] with method=ppo, got 0",
        ),
        (
            {"timesteps": -1},
            r"finetuning.timesteps must be an integer in \[0, 10000000\] with method=imitate",
        ),
        ({"method": "bc"}, r"finetuning.method must be one of \['imitate', 'ppo'\], got 'bc'"),
        ({"dagger_rounds": 21}, r"finetuning.dagger_rounds must be an integer in \[0, 20\], got 21"),
        ({"episodes": 0}, r"finetuning.episodes must be an integer in \[1, 10000\], got 0"),
        ({"domain": [1]}, r"finetuning.domain must be a mapping of DomainRandomization fields"),
        ({"learning_rate": 0.5}, r"finetuning.learning_rate must lie in \(0, 0.01\], got 0.5"),
        ({"seeds": []}, "finetuning.seeds must list 1-100 distinct integer seeds, got"),
        ({"budget": 1}, r"finetuning.budget is not a setting; finetuning takes \['method', 'max_s'"),
        ({"opening": "first"}, r"finetuning.opening must be one of \['refit', 'job'\], got 'first'"),
        (
            {"opening_seeds": [2000]},
            r"finetuning.opening_seeds must differ from finetuning.seeds .*: both hold \[2000\]",
        ),
        ({"opening_seeds": [True]}, "finetuning.opening_seeds must list 1-100 distinct integer seeds"),
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


def test_the_run_is_the_bundles_own_in_worlds_of_the_refit_shaped_like_the_deploy(
    bundle_ctl, refit, tmp_path
):
    settings = ft.Finetuning(max_s=30.0, timesteps=2048, domain={"speed_sd": 0.3})
    cfg = ft.train_config(
        bundle_ctl.bundle, refit, settings, tmp_path / "run", seed=3, interval=10, scale_s=8.0
    )
    base = bundle_ctl.bundle.meta.config
    assert cfg.domain == {
        "profile": str(refit), "scenarios": ["static_hetero"], "speed_sd": 0.3, "throttle_windows": 1,
        "window_start_s": [0.0, 8.0], "window_duration_s": [0.8, 4.0], "window_factor": [0.3, 0.8],
    }  # fmt: skip
    assert cfg.finetune_from == str(BUNDLE) and cfg.max_train_s == 30.0 and cfg.total_timesteps == 2048
    assert (
        list(cfg.cluster_sizes) == [2, 2, 2, 2] == list(base["cluster_sizes"])
        and cfg.env["reward"] == base["reward"]
        and cfg.env["interval"] == 10  # the deploy's K, not the bundle's training K
    )
    assert cfg.ppo["learning_rate"] == 3e-5 and cfg.resume is False and list(cfg.eval_seeds) == [1000]
    # imitation of the expert the bundle was distilled from, its statistics kept, the critic warmed up
    assert cfg.expert_pretrain.expert == base["expert_pretrain"]["expert"] == "oracle"
    assert (cfg.expert_pretrain.episodes, cfg.expert_pretrain.dagger_rounds) == (100, 3)
    assert cfg.freeze_obs_norm and cfg.critic_warmup_steps == 512
    assert list(cfg.eval_scenarios) == ["domain"] and cfg.eval_workers == 2
    ppo_only = ft.train_config(
        bundle_ctl.bundle, refit, ft.Finetuning(method="ppo", timesteps=100), tmp_path / "r", 3, 10, 8.0
    )
    assert ppo_only.expert_pretrain is None and ppo_only.total_timesteps == 100
    with pytest.raises(ValueError, match=r"finetuning.seeds \[1000\] are the bundle's validation seeds"):
        ft.train_config(
            bundle_ctl.bundle, refit, ft.Finetuning(seeds=(1000, 2000)), tmp_path / "r2", 0, 10, 8.0
        )
    with pytest.raises(
        ValueError, match=r"finetuning.seeds \[7\] are the bundle's validation seeds or the fine-tune's seed"
    ):
        ft.train_config(bundle_ctl.bundle, refit, ft.Finetuning(seeds=(7, 2000)), tmp_path / "r3", 7, 10, 8.0)


def test_a_bundle_without_an_expert_imitates_the_time_to_target_oracle(bundle_ctl):
    from types import SimpleNamespace

    bare = SimpleNamespace(meta=SimpleNamespace(config={"expert_pretrain": None}))
    assert ft.expert_of(bare) == {
        "expert": "oracle", "expert_kwargs": {"objective": "time_to_target", "batch_penalty": 0.0},
    }  # fmt: skip
    assert ft.expert_of(bundle_ctl.bundle)["expert"] == "oracle"


def test_a_redeployed_universal_bundle_finetunes_on_the_refits_cluster_under_its_deployed_split(
    refit, tmp_path
):
    """The universal bundle was trained over clusters of 2-16 under the balanced split and is deployed
    under balanced_cost: its fine-tuning runs on the refit's one cluster size, under the deployed split."""
    from dynamix_gym.learning.training import _env_of_bundle

    bundle = PPOController(path=ROOT / "results" / "policies" / "universal").bundle
    assert bundle.meta.config["cluster_sizes"] == [2, 4, 8, 16] and bundle.meta.split == "balanced_cost"
    cfg = ft.train_config(
        bundle, refit, ft.Finetuning(max_s=30.0, timesteps=2048), tmp_path / "run", 0, 20, 5.0
    )
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
    # started before learn (a warm start's time counts): the bound runs from then
    now[0] = 10.0
    early = WallClockLimit(5.0, clock=lambda: now[0], started=7.0)
    early._on_training_start()
    assert early._on_step()
    now[0] = 12.0
    assert not early._on_step() and early.stopped


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
    settings = ft.Finetuning(
        max_s=60.0, timesteps=1024, episodes=6, dagger_rounds=1, dagger_episodes=4, epochs=2,
        seeds=(2000, 2001), progress=False,
    )  # fmt: skip
    chosen, record = ft.finetune_in_refit(
        bundle_ctl, refit, SCENARIOS["static_hetero"], 20, settings, tmp_path, 0
    )
    assert record["train"]["timesteps"] >= 1024 or record["train"]["stopped_by_wall_clock"]
    imitation = record["train"]["imitation"]
    assert imitation["expert"] == "oracle" and imitation["episodes"] == 10 and len(imitation["dagger"]) == 1
    assert record["method"] == "imitate" and record["episode_scale_s"] > 0
    tuned = PPOController(path=tmp_path / ft.RUN_DIR / "policy")
    assert tuned.bundle.meta.config["domain"]["profile"] == str(refit)  # it records where it was tuned
    # the imitation kept the statistics the bundle's weights read (frozen through PPO too)
    np.testing.assert_array_equal(tuned.bundle.obs_norm.mean, bundle_ctl.bundle.obs_norm.mean)
    np.testing.assert_array_equal(tuned.bundle.obs_norm.var, bundle_ctl.bundle.obs_norm.var)
    assert tuned.env_options() == bundle_ctl.env_options()  # the deploy's env fits either
    means = record["mean_tta_s"]
    assert (
        record["kept"] == (means["finetuned"] < means["bundle"])
        and (chosen is not bundle_ctl) == record["kept"]
    )
    assert len(record["tta_s"]["bundle"]) == len(record["tta_s"]["finetuned"]) == 2


def _fake_tta(scores):
    """held_out_tta's stand-in: per controller and opening, two seeds' scores."""

    def tta(controller, refit_dir, scenario, interval, seeds, initial_batch=None):
        own = getattr(controller, "opening", None)
        return list(scores(controller, own if own is not None else initial_batch))

    return tta


@pytest.mark.parametrize(
    ("scores", "chosen"),
    [
        ({32: 10.0, 8: 9.0, 16: 9.0, 64: 12.0}, 8),  # the fastest; of two alike the first listed
        ({32: 9.0, 8: 9.0, 16: 9.5, 64: 12.0}, 32),  # the job's batch unless another is strictly faster
        ({32: 9.0, 8: 11.0, 16: 9.5, 64: 12.0}, 32),
    ],
)
def test_the_opening_is_the_experts_fastest_batch_in_the_refit(refit, monkeypatch, scores, chosen):
    candidates = ft.opening_candidates(refit, 32, (64, 8, 16, 32))
    assert candidates == [32, 8, 16, 64]  # the job's first, then the ladder's, sorted
    expert = make_controller("oracle")
    seen = []

    def tta(controller, refit_dir, scenario, interval, seeds, initial_batch=None):
        seen.append((controller, initial_batch, tuple(seeds)))
        return [scores[initial_batch]] * len(seeds)

    monkeypatch.setattr(ft, "held_out_tta", tta)
    op = ft.choose_opening(expert, refit, SCENARIOS["static_hetero"], 10, (3000, 3001), candidates)
    assert op["chosen"] == chosen and op["job"] == 32
    assert op["expert_mean_tta_s"] == {str(b): scores[b] for b in candidates}
    assert all(c is expert and s == (3000, 3001) for c, _, s in seen)


def test_openings_outside_the_refits_range_are_not_candidates_and_a_job_outside_is_refused(refit):
    spec = ft.HeteroClusterEnv(profile=ft.load_profile(refit)).backend.spec
    lo, hi = int(spec.min_batch.max()), int(spec.max_batch.min())
    assert ft.opening_candidates(refit, lo, (lo - 1, hi, hi + 1)) == [lo, hi]
    with pytest.raises(
        ValueError, match=rf"the job's local batch {hi + 1} lies outside the refit's range \[{lo}, {hi}\]"
    ):
        ft.opening_candidates(refit, hi + 1, (lo,))


def _finetune_from_32(bundle_ctl, refit, tmp_path, settings, ladder):
    """finetune_in_refit for a job whose ranks open at local batch 32, the calibration's ``ladder``."""
    return ft.finetune_in_refit(
        bundle_ctl, refit, SCENARIOS["static_hetero"], 10, settings, tmp_path, 0, job_batch=32, ladder=ladder
    )


@pytest.mark.parametrize("kept", [True, False])
def test_the_fine_tune_starts_at_the_opening_and_a_kept_bundle_opens_there(
    bundle_ctl, refit, tmp_path, monkeypatch, kept
):
    copy = shutil.copytree(BUNDLE, tmp_path / "tuned")
    made = {}

    def train(cfg, config_dict):
        made["cfg"] = cfg
        return {
            "final_bundle": str(copy),
            "timesteps": 0,
            "train_seconds": 1.0,
            "stopped_by_wall_clock": False,
        }

    def scores(controller, batch):
        if controller is bundle_ctl:
            return [10.0, 10.0]
        if isinstance(controller, PPOController):  # the fine-tuned bundle, from its opening
            assert batch == 16
            return [9.0, 9.0] if kept else [11.0, 11.0]
        return [8.0, 8.0] if batch == 16 else [9.0, 9.0]  # the expert: 16 is the fastest opening

    monkeypatch.setattr(ft, "train", train)
    monkeypatch.setattr(ft, "held_out_tta", _fake_tta(scores))
    settings = ft.Finetuning(seeds=(2000, 2001), opening_seeds=(3000, 3001), progress=False)
    chosen, record = _finetune_from_32(bundle_ctl, refit, tmp_path, settings, (16, 32, 64))
    assert made["cfg"].env["sim_kwargs"]["initial_batch"] == 16  # the fine-tune's worlds open there
    assert record["opening"]["chosen"] == 16 and record["opening"]["applied"] is kept
    assert record["kept"] is kept
    if kept:
        assert chosen is not bundle_ctl and chosen.opening == 16
    else:  # the bundle as it came, from the job's batch
        assert chosen is bundle_ctl and bundle_ctl.opening is None
    assert json.loads((tmp_path / ft.RECORD_FILE).read_text())["opening"]["applied"] is kept


def test_with_opening_job_the_fine_tune_keeps_the_jobs_batch(bundle_ctl, refit, tmp_path, monkeypatch):
    copy = shutil.copytree(BUNDLE, tmp_path / "tuned")
    made = {}
    monkeypatch.setattr(ft, "train", lambda cfg, config_dict: made.setdefault("cfg", cfg) and {
        "final_bundle": str(copy), "timesteps": 0, "train_seconds": 1.0, "stopped_by_wall_clock": False,
    })  # fmt: skip
    monkeypatch.setattr(ft, "held_out_tta", _fake_tta(lambda c, b: [10.0] if c is bundle_ctl else [9.0]))
    settings = ft.Finetuning(seeds=(2000,), opening="job", progress=False)
    chosen, record = _finetune_from_32(bundle_ctl, refit, tmp_path, settings, (16, 64))
    assert record["opening"] is None and chosen.opening is None
    assert "initial_batch" not in (made["cfg"].env.get("sim_kwargs") or {})


def test_a_bundle_with_an_opening_runs_its_first_interval_there(bundle_ctl):
    from dynamix_gym.evaluation import run_episode

    opened = PPOController(bundle=bundle_ctl.bundle, opening=16)
    env = ft.HeteroClusterEnv(profile=ft.load_profile(PROFILE), scenario="static_hetero", interval=10,
                              action_mode=opened.action_mode, initial_batch=32, max_decisions=2,
                              **opened.env_options())  # fmt: skip
    try:
        first = run_episode(env, opened, 0).timeline[0]
    finally:
        env.close()
    assert [first[f"w{i}_batch"] for i in range(env.num_workers)] == [16] * env.num_workers
    spec = env.backend.spec
    with pytest.raises(ValueError, match=r"opening\[0\] = 100000 is outside worker 0's range \[\d+, \d+\]"):
        PPOController(bundle=bundle_ctl.bundle, opening=100000).initial_batches(spec)
    with pytest.raises(
        ValueError, match=r"opening \(the warm-up interval's local batch\) must be an integer >= 1"
    ):
        PPOController(bundle=bundle_ctl.bundle, opening=0)


def test_the_deploys_wrapper_opens_where_the_bundle_does_but_not_on_a_resumed_run(bundle_ctl):
    from types import SimpleNamespace

    from experiments.deploy import ResumableController

    opened = PPOController(bundle=bundle_ctl.bundle, opening=16)
    spec = ft.HeteroClusterEnv(profile=ft.load_profile(PROFILE)).backend.spec
    fresh = SimpleNamespace(extra_state={}, restored_extra={}, resuming=False)
    np.testing.assert_array_equal(
        ResumableController(opened, fresh).initial_batches(spec), [16] * spec.num_workers
    )
    assert ResumableController(bundle_ctl, fresh).initial_batches(spec) is None
    resumed = SimpleNamespace(extra_state={}, restored_extra={}, resuming=True)
    assert ResumableController(opened, resumed).initial_batches(spec) is None  # the checkpoint's batches
