"""PPO pretraining end to end: train -> bundle -> load -> evaluate, resume, fine-tune, mismatches."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from support import TINY, tiny

from dynamix_gym import OBS_SCHEMA, HeteroClusterEnv
from dynamix_gym.controllers.bundle import BundleMismatchError, PPOController, load_bundle
from dynamix_gym.evaluation import run_episode
from dynamix_gym.learning.training import latest_checkpoint, train


def test_train_bundle_load_evaluate(tmp_path):
    result = train(tiny(tmp_path))
    assert result["timesteps"] >= 1200 and math.isfinite(result["best_validation_tta_s"])
    bundle = load_bundle(result["best_bundle"])
    assert bundle.meta.obs_form == "per_worker" and bundle.meta.action_set == [-100, -25, 0, 25, 100]
    assert bundle.obs_norm is not None and bundle.obs_norm.mean.shape == (32,)
    controller = PPOController(result["final_bundle"])
    for workers in (4, 16):  # trained on 2-3 workers, drives any size
        env = HeteroClusterEnv(workers=workers, max_decisions=5)
        res = run_episode(env, controller, seed=0, scenario="static_hetero")
        assert res.summary["decisions"] == 5 and res.summary["controller"] == "ppo"
    assert (tmp_path / "run" / "checkpoints").is_dir()
    assert any((tmp_path / "run" / "tb").iterdir())


def test_same_seed_reproduces_training(tmp_path):
    cfg = dict(total_timesteps=400, checkpoint_every=10**9)
    a = load_bundle(train(tiny(tmp_path / "a", **cfg))["final_bundle"])
    b = load_bundle(train(tiny(tmp_path / "b", **cfg))["final_bundle"])
    for pa, pb in zip(a.model.policy.parameters(), b.model.policy.parameters(), strict=True):
        np.testing.assert_array_equal(pa.detach().numpy(), pb.detach().numpy())


def test_resume_continues_from_last_checkpoint(tmp_path):
    cfg = tiny(tmp_path, total_timesteps=1200)
    train(cfg)
    ckpt = latest_checkpoint(Path(cfg.run_dir) / "checkpoints")
    assert ckpt is not None and ckpt[1] is not None  # VecNormalize statistics saved beside it
    # Simulate a crash after the last checkpoint: ask for more steps in the same run dir.
    cfg2 = tiny(tmp_path, total_timesteps=2400)
    result = train(cfg2)
    steps_at_ckpt = int(ckpt[0].name.split("_")[2])
    assert steps_at_ckpt >= 600
    assert result["timesteps"] >= 2400
    assert result["timesteps"] - steps_at_ckpt < 2400  # did not start over


def test_corrupt_newest_checkpoint_falls_back(tmp_path):
    cfg = tiny(tmp_path)
    train(cfg)
    ckpt_dir = Path(cfg.run_dir) / "checkpoints"
    newest, _ = latest_checkpoint(ckpt_dir)
    (ckpt_dir / "rl_model_999999_steps.zip").write_bytes(b"half-written")
    assert latest_checkpoint(ckpt_dir)[0] == newest


def test_finetune_makes_a_new_bundle(tmp_path):
    base = train(tiny(tmp_path / "base"))["final_bundle"]
    tuned = {**TINY["ppo"], "learning_rate": 1e-5, "gamma": 0.9, "n_steps": 32, "clip_range": 0.05}
    cfg = tiny(tmp_path / "ft", finetune_from=base, total_timesteps=400, ppo=tuned)
    result = train(cfg)
    assert Path(result["final_bundle"]) != Path(base)
    a, b = load_bundle(base), load_bundle(result["final_bundle"])
    # every ppo setting of the fine-tuning run replaces the bundle's, none is silently kept
    assert (a.model.gamma, a.model.n_steps) == (0.99, 64)
    assert (b.model.gamma, b.model.n_steps, b.model.clip_range(1.0)) == (0.9, 32, 0.05)
    assert b.model.rollout_buffer.buffer_size == 32
    with pytest.raises(ValueError, match=r"ppo\.use_sde cannot be set when fine-tuning"):
        train(tiny(tmp_path / "bad", finetune_from=base, ppo={**TINY["ppo"], "use_sde": True}))
    diff = sum(
        float(np.abs(pa.detach().numpy() - pb.detach().numpy()).sum())
        for pa, pb in zip(a.model.policy.parameters(), b.model.policy.parameters(), strict=True)
    )
    assert diff > 0


def test_freeze_obs_norm_keeps_the_pretrained_statistics_through_ppo(tmp_path):
    """Fine-tuning with freeze_obs_norm: the bundle's observation statistics come out unchanged
    (without it PPO's rollouts move them); a run with nothing pretrained to keep is refused."""
    from dynamix_gym.learning.training import check_train_config

    base = train(tiny(tmp_path / "base"))["final_bundle"]
    before = load_bundle(base).obs_norm
    kept = load_bundle(
        train(tiny(tmp_path / "kept", finetune_from=base, total_timesteps=400, freeze_obs_norm=True))[
            "final_bundle"
        ]
    )
    moved = load_bundle(
        train(tiny(tmp_path / "moved", finetune_from=base, total_timesteps=400))["final_bundle"]
    )
    np.testing.assert_array_equal(kept.obs_norm.mean, before.mean)
    np.testing.assert_array_equal(kept.obs_norm.var, before.var)
    assert not np.array_equal(moved.obs_norm.mean, before.mean)
    with pytest.raises(ValueError, match="freeze_obs_norm=true keeps pretrained observation statistics"):
        check_train_config(tiny(tmp_path / "fresh", freeze_obs_norm=True))


def test_critic_warmup_trains_the_value_function_alone_until_its_steps_are_done(tmp_path):
    """critic_warmup_steps: while the warm-up lasts, PPO moves the value network and leaves the
    actor (policy network, action head) exactly as it was; past it, both learn."""
    from dynamix_gym.learning.training import check_train_config

    base = train(tiny(tmp_path / "base", total_timesteps=200, checkpoint_every=10**9))["final_bundle"]

    def parts(path):
        pol = load_bundle(path).model.policy
        actor = [
            p.detach().numpy().copy()
            for p in (*pol.mlp_extractor.policy_net.parameters(), *pol.action_net.parameters())
        ]
        critic = [
            p.detach().numpy().copy()
            for p in (*pol.mlp_extractor.value_net.parameters(), *pol.value_net.parameters())
        ]
        return actor, critic

    def moved(a, b):
        return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))

    actor0, critic0 = parts(base)
    common = dict(finetune_from=base, total_timesteps=400, checkpoint_every=10**9)
    frozen = train(tiny(tmp_path / "warm", critic_warmup_steps=10**6, **common))["final_bundle"]
    actor1, critic1 = parts(frozen)
    assert moved(actor0, actor1) == 0.0 and moved(critic0, critic1) > 0.0
    thawed = train(tiny(tmp_path / "thaw", critic_warmup_steps=128, **common))["final_bundle"]
    assert moved(actor0, parts(thawed)[0]) > 0.0
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        check_train_config(tiny(tmp_path / "bad", critic_warmup_steps=-1))
    with pytest.raises(ValueError, match="time_scale"):
        check_train_config(tiny(tmp_path / "bad", time_scale="hours"))


def test_world_time_scale_trains_and_scales_every_world_to_its_own_time(tmp_path):
    """time_scale=world: the training worlds' time reward is divided by each world's own scale
    (the time penalty of a whole episode then reads near -1); validation still measures seconds."""
    result = train(tiny(tmp_path, total_timesteps=300, checkpoint_every=10**9, time_scale="world"))
    assert math.isfinite(result["best_validation_tta_s"]) and result["best_validation_tta_s"] > 10.0


def test_schema_and_action_set_mismatches_are_refused(tmp_path):
    bundle_dir = Path(train(tiny(tmp_path, total_timesteps=200, checkpoint_every=10**9))["final_bundle"])
    meta = json.loads((bundle_dir / "bundle.json").read_text())
    meta["schema_version"] = "0"
    (bundle_dir / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(BundleMismatchError, match="schema"):
        load_bundle(bundle_dir)
    meta["schema_version"] = "1"
    meta["feature_names"] = meta["feature_names"][:-1]
    (bundle_dir / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(BundleMismatchError, match="features"):
        load_bundle(bundle_dir)
    meta["feature_names"] = OBS_SCHEMA.per_worker_names()
    (bundle_dir / "bundle.json").write_text(json.dumps(meta))
    controller = PPOController(bundle_dir)
    env = HeteroClusterEnv(workers=2, action_set=(-50, 0, 50), max_decisions=2)
    with pytest.raises(BundleMismatchError, match="batch deltas"):
        run_episode(env, controller, seed=0)
    with pytest.raises(FileNotFoundError, match=r"bundle\.json"):
        load_bundle(tmp_path)


FIDELITY_PROFILE = Path(__file__).resolve().parents[3] / "results" / "fidelity" / "profile"
PROFILE_DOMAIN = {
    "profile": str(FIDELITY_PROFILE),
    "scenarios": ["static_hetero"],
    "speed_sd": 0.5,
    "throttle_windows": 2,
    "window_start_s": [0.0, 10.0],
    "window_duration_s": [1.0, 5.0],
    "window_factor": [0.3, 0.8],
}


def test_profile_domain_draws_the_profiled_cluster_with_random_speeds_and_windows():
    from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv

    dom = DomainRandomization(workers=2, **PROFILE_DOMAIN)
    rng = np.random.default_rng(0)
    draws = [dom.sample(rng) for _ in range(200)]
    assert {d["cluster"].gpu_types for d in draws} == {("cpu", "cpu")}
    assert {d["workload"].name for d in draws} == {"mnist_cnn"}
    speeds = np.array([d["scenario"].worker_speed for d in draws])
    assert speeds.shape == (200, 2) and np.std(np.log(speeds)) == pytest.approx(0.5, rel=0.15)
    counts = [len(d["scenario"].windows) for d in draws]
    assert set(counts) == {0, 1, 2}
    for w in (w for d in draws for w in d["scenario"].windows):
        assert w.kind == "throttle" and 0 <= w.start_s <= 10 and 1 <= w.duration_s <= 5
        assert 0.3 <= w.factor <= 0.8 and w.worker in (0, 1)
    env = RandomizedClusterEnv(domain=dom)
    _, info = env.reset(seed=5)
    assert info["domain"]["workload"] == "mnist_cnn" and env.backend.spec.gpu_types == ("cpu", "cpu")
    env.close()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"workers": 4}, r"domain.workers is 4 .* 2 workers"),
        ({"window_factor": [0.5, 1.5]}, r"domain.window_factor\[1\]"),
        ({"window_start_s": [5.0, 1.0]}, r"domain.window_start_s"),
        ({"throttle_windows": -1}, r"domain.throttle_windows"),
    ],
)
def test_profile_domain_bad_input_names_the_field(overrides, match):
    from dynamix_gym.envs.randomized import DomainRandomization

    with pytest.raises(ValueError, match=match):
        DomainRandomization(**{"workers": 2, **PROFILE_DOMAIN, **overrides})


def test_pretraining_on_a_calibrated_profile_validates_on_domain_draws(tmp_path):
    cfg = tiny(
        tmp_path,
        total_timesteps=600,
        cluster_sizes=(2, 2),
        domain=PROFILE_DOMAIN,
        env={"interval": 20, "reward": {"kind": "time"}},
        eval_scenarios=("domain",),
        eval_workers=2,
    )
    result = train(cfg)
    tta = load_bundle(result["best_bundle"]).meta.metadata["validation_tta_s"]
    assert set(tta) == {"domain"} and 0 < tta["domain"] < 240  # profile's budget is 120 s
    env = HeteroClusterEnv(profile=FIDELITY_PROFILE, interval=20)
    res = run_episode(env, PPOController(result["best_bundle"]), seed=0, scenario="profile")
    assert res.summary["decisions"] >= 1 and env.backend.spec.gpu_types == ("cpu", "cpu")


def test_generated_worlds_mix_one_to_four_types_and_refuse_unknown_ones():
    from dynamix_gym.envs.randomized import DomainRandomization

    types = ("T4", "V100", "RTX2080Ti", "A100", "QuadroRTX6000")
    dom = DomainRandomization(workers=6, gpu_types=types, max_types=4, workloads=("cifar10", "ncf", "bert"))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(40):
        cluster = dom.sample(rng)["cluster"]
        kinds = set(cluster.gpu_types)
        assert 1 <= len(kinds) <= 4 and kinds <= set(types) and cluster.num_workers == 6
        seen.add(len(kinds))
    assert seen == {1, 2, 3, 4}
    with pytest.raises(ValueError, match=r"domain\.gpu_types"):
        DomainRandomization(gpu_types=("T4", "H900"))
    with pytest.raises(ValueError, match="twice"):
        DomainRandomization(gpu_types=("T4", "T4"))


def test_generated_compute_curves_are_drawn_per_type_and_reach_the_simulator():
    from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv
    from sim.engine import Simulator
    from sim.hardware import compute_params

    plain = DomainRandomization(workers=4, gpu_types=("T4", "V100"), workloads=("cifar10",))
    # Off by default: the draws (and so every committed training run) are what they were.
    assert "compute_params" not in plain.sample(np.random.default_rng(0))
    dom = DomainRandomization(
        workers=4, gpu_types=("T4", "V100"), workloads=("cifar10",), compute_sd=0.5, exponent_scale=(0.8, 1.6)
    )
    rng = np.random.default_rng(1)
    ratios, exps = [], []
    for _ in range(200):
        draw = dom.sample(rng)
        assert set(draw["compute_params"]) == set(draw["cluster"].gpu_types)
        for g, cp in draw["compute_params"].items():
            base = compute_params(g, "cifar10")
            ratios.append(math.log(cp.beta_s / base.beta_s))
            exps.append(cp.exponent / base.exponent)
            assert cp.max_batch == base.max_batch and 0.25 <= cp.exponent <= 2.0
    assert np.std(ratios) == pytest.approx(0.5, rel=0.15)
    assert 0.8 <= min(exps) < 0.9 and 1.5 < max(exps) <= 1.6
    env = RandomizedClusterEnv(domain=dom)
    env.reset(seed=3)
    sim, drawn = env.backend.sim, env.episode_config["compute_params"]
    assert sim._exponent.tolist() == [drawn[g].exponent for g in sim.gpu_types]
    env.close()
    with pytest.raises(ValueError, match=r"compute_params names GPU types \['A100'\]"):
        Simulator("t4v100", compute_params={"A100": compute_params("A100", "cifar10")})
    with pytest.raises(ValueError, match=r"domain\.exponent_scale\[1\]"):
        DomainRandomization(exponent_scale=(1.0, 20.0))
    with pytest.raises(ValueError, match=r"domain\.compute_sd"):
        DomainRandomization(compute_sd=-0.1)


def test_generated_learning_rate_limits_are_drawn_and_slow_the_simulated_progress():
    from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv
    from sim.engine import Simulator

    plain = DomainRandomization(workers=4, workloads=("cifar10",))
    assert "convergence_params" not in plain.sample(np.random.default_rng(0))  # off by default
    dom = DomainRandomization(
        workers=4, workloads=("cifar10",), lr_limit_probability=0.5, lr_stable_gain=(2.0, 8.0)
    )
    draws = [dom.sample(np.random.default_rng(s)).get("convergence_params") for s in range(200)]
    limited = [c for c in draws if c is not None]
    assert 70 < len(limited) < 130
    gains = [c.lr_stable_gain for c in limited]
    assert 2.0 <= min(gains) < 2.5 and 7.0 < max(gains) <= 8.0
    assert all(0.5 <= c.lr_unstable_exponent <= 1.5 and c.name == "cifar10" for c in limited)
    env = RandomizedClusterEnv(domain={**dom.__dict__, "lr_limit_probability": 1.0})
    env.reset(seed=3)
    assert env.backend.sim.convergence.params == env.episode_config["convergence_params"]
    env.close()
    # the limit acts: past its gain, a step makes less progress than the fitted model's
    fitted = Simulator("t4v100", "cifar10").convergence
    capped = Simulator("t4v100", "cifar10", convergence_params=limited[0]).convergence
    mid = 0.5 * fitted.params.total_progress  # a noise scale at which AdaScale's gain at 8192 is large
    assert capped.progress_per_step(8192, mid) < 0.5 * fitted.progress_per_step(8192, mid)
    assert capped.progress_per_step(fitted.base_batch, mid) == fitted.progress_per_step(
        fitted.base_batch, mid
    )
    with pytest.raises(ValueError, match=r"domain\.lr_stable_gain\[0\]"):
        DomainRandomization(lr_stable_gain=(0.5, 2.0))
    with pytest.raises(ValueError, match=r"domain\.lr_limit_probability"):
        DomainRandomization(lr_limit_probability=1.5)
    with pytest.raises(ValueError, match="convergence_params must be"):
        Simulator("t4v100", convergence_params={"lr_stable_gain": 2.0})


def test_compound_fault_worlds_overlap_families_and_leave_other_draws_alone():
    """With compound_probability a world runs several fault families at once (each process from
    its most active part); off, no draw is made, so the single-family worlds stay as they were."""
    from dynamix_gym.envs.randomized import DomainRandomization
    from sim.engine import Simulator
    from sim.faults import SCENARIOS, compose_scenarios

    both = compose_scenarios(
        [SCENARIOS["throttle"], SCENARIOS["congestion_windows"], SCENARIOS["interference"]]
    )
    assert both.throttle == SCENARIOS["throttle"].throttle
    assert both.interference == SCENARIOS["interference"].interference
    assert both.windows == SCENARIOS["congestion_windows"].windows
    assert both.network.bandwidth_cv == SCENARIOS["congestion_windows"].network.bandwidth_cv
    assert both.name == "throttle+congestion_windows+interference"
    assert compose_scenarios([SCENARIOS["jitter"]]) is SCENARIOS["jitter"]
    with pytest.raises(ValueError, match="at least one"):
        compose_scenarios([])
    families = ("static_hetero", "throttle", "jitter", "interference", "loss_rejoin")
    plain = DomainRandomization(workers=4, scenarios=families, workloads=("cifar10", "ncf"))
    dom = DomainRandomization(
        workers=4,
        scenarios=families,
        workloads=("cifar10", "ncf"),
        compound_probability=0.5,
        compound_families=(2, 3),
    )
    compounds = 0
    for s in range(100):
        a, b = plain.sample(np.random.default_rng(s)), dom.sample(np.random.default_rng(s))
        assert (a["cluster"], a["workload"]) == (b["cluster"], b["workload"])
        assert b["scenario"].worker_speed == a["scenario"].worker_speed
        parts = b["scenario"].name.split("+")
        assert parts[0] == a["scenario"].name and 1 <= len(parts) <= 3 and len(set(parts)) == len(parts)
        compounds += len(parts) > 1
        if len(parts) == 1:
            assert b["scenario"] == a["scenario"]
    assert 30 < compounds < 70
    # a compound world's processes all act: throttling and interference in one run
    sc = compose_scenarios([SCENARIOS["throttle"], SCENARIOS["interference"]])
    sim = Simulator("t4v100", "cifar10", sc)
    sim.reset(seed=0)
    kinds = set()
    for _ in range(60):
        sim.run_interval(np.full(8, 128), 50)
        kinds |= {e.kind for e in sim.fault_log}
    assert {"throttle", "interference"} <= kinds
    for bad, match in (
        ({"compound_probability": 1.5}, r"domain\.compound_probability"),
        ({"compound_families": (1, 2)}, r"domain\.compound_families\[0\]"),
        ({"compound_families": (3, 2)}, r"domain\.compound_families"),
        ({"compound_probability": 0.5, "scenarios": ("throttle",)}, "two distinct"),
    ):
        with pytest.raises(ValueError, match=match):
            DomainRandomization(**bad)


def test_a_tiny_generated_world_run_trains_a_masked_scale_free_bundle_end_to_end(tmp_path):
    """MaskablePPO on schema 2 with multiplicative steps over generated worlds (several GPU types
    and workloads), warm-started by the oracle, validated on a benchmark train-split task; the
    bundle records all of it and drives an unseen cluster size and workload."""
    from dynamix_gym.benchmark import validation_tasks as benchmark_eval_tasks

    cfg = tiny(
        tmp_path,
        algorithm="maskable_ppo",
        action_mode="scale",
        env={"interval": 50, "reward": {"kind": "time"}, "max_decisions": 30, "obs_schema": 2},
        domain={"gpu_types": ("T4", "V100", "A100"), "workloads": ("cifar10", "ncf")},
        eval_tasks=benchmark_eval_tasks(["ncf_t4v100_jitter"]),
        expert_pretrain={
            "expert": "oracle",
            "episodes": 2,
            "epochs": 2,
            "dagger_rounds": 1,
            "dagger_episodes": 1,
        },
    )
    result = train(cfg)
    bundle = load_bundle(result["best_bundle"])
    meta = bundle.meta
    assert (meta.algorithm, meta.action_mode, meta.schema_version) == ("maskable_ppo", "scale", "2")
    assert meta.action_set == [0.5, 0.8, 1.0, 1.25, 2.0]
    assert "ncf_t4v100_jitter" in result["history"][-1]["tta_s"]
    assert meta.metadata["warm_start"]["dagger"]
    ctrl = PPOController(result["final_bundle"])
    # the apps build a bundle's env from what the bundle asks for (evaluate, benchmark, deploy)
    from dynamix_gym.controllers.base import env_options

    options = env_options(ctrl)
    assert options == {"obs_schema": 2, "action_set": [0.5, 0.8, 1, 1.25, 2]}
    env = HeteroClusterEnv(
        workers=6, workload="bert", action_mode=ctrl.action_mode, max_decisions=4, **options
    )
    res = run_episode(env, ctrl, seed=0, scenario="static_hetero")
    assert res.summary["decisions"] == 4
    with pytest.raises(BundleMismatchError, match="schema"):
        run_episode(HeteroClusterEnv(workers=6, action_mode="scale", max_decisions=2), ctrl, seed=0)
    # fine-tuning takes the bundle's schema and action set unless told otherwise, and refuses another
    tune = dict(algorithm="maskable_ppo", action_mode="scale", finetune_from=result["best_bundle"],
                total_timesteps=300, expert_pretrain=None)  # fmt: skip
    tuned = train(tiny(tmp_path / "ft", **tune))
    assert load_bundle(tuned["final_bundle"]).meta.schema_version == "2"
    assert tuned["history"][0]["timesteps"] == 0  # the starting bundle is the curve's first point
    with pytest.raises(ValueError, match=r"env\.action_set"):
        train(
            tiny(
                tmp_path / "ft2",
                **tune,
                env={"interval": 50, "reward": {"kind": "time"}, "action_set": [0.5, 2.0]},
            )
        )


def test_training_refuses_what_cannot_train(tmp_path):
    from dynamix_gym.benchmark import validation_tasks as benchmark_eval_tasks

    with pytest.raises(ValueError, match="algorithm must be one of"):
        train(tiny(tmp_path, algorithm="a2c"))
    with pytest.raises(ValueError, match="action_mode must be 'delta' or 'scale'"):
        train(tiny(tmp_path, action_mode="absolute"))
    with pytest.raises(ValueError, match="maskable_ppo needs obs_form=per_worker"):
        train(tiny(tmp_path, algorithm="maskable_ppo", obs_form="centralised"))
    with pytest.raises(ValueError, match="not tasks of the train split"):
        benchmark_eval_tasks(["cifar10_t4v100_mixed"])  # a test-split task
