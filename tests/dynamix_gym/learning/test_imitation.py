"""Behaviour-cloning warm start from an expert controller."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dynamix_gym.learning.imitation import collect_expert_data, expert_deltas
from dynamix_gym.learning.training import TrainConfig, train

ACTIONS = np.array([-100, -25, 0, 25, 100])


def test_expert_deltas_step_towards_the_target_and_hold_near_it():
    current = np.array([128, 128, 128, 128, 128])
    target = np.array([500.0, 150.0, 135.0, 100.0, 16.0])
    idx = expert_deltas(current, target, ACTIONS, tolerance=12.5)
    assert ACTIONS[idx].tolist() == [100, 25, 0, -25, -100]


def test_expert_rollouts_reach_the_target():
    data = collect_expert_data({}, {"interval": 50, "reward": "time"}, [3], episodes=2, gamma=0.99, seed=0)
    assert data.obs.shape[1] == 32 and len(data.obs) == len(data.actions) == len(data.returns)
    assert np.isfinite(data.mean_tta_s)
    assert set(np.unique(data.actions)) <= set(range(5))


def _tiny(run_dir: Path, total_timesteps: int, ppo: dict, **expert) -> TrainConfig:
    """A few seconds of training on 3-worker clusters, warm-started from the oracle."""
    return TrainConfig(
        run_dir=str(run_dir),
        total_timesteps=total_timesteps,
        cluster_sizes=(3,),
        env={"interval": 50, "reward": {"kind": "time"}},
        ppo=ppo,
        policy_kwargs={"net_arch": [32, 32]},
        checkpoint_every=10**9,
        eval_every=10**9,
        eval_scenarios=("static_hetero",),
        eval_seeds=(1000,),
        eval_workers=4,
        progress_bar=False,
        expert_pretrain={"expert": "oracle", "epochs": 30, **expert},
    )


def test_warm_start_clones_the_expert(tmp_path):
    cfg = _tiny(
        tmp_path,
        256,
        {"n_steps": 64, "batch_size": 64, "n_epochs": 1},
        episodes=4,
        cache_dir=str(tmp_path / "cache"),
    )
    train(cfg)
    assert len(list((tmp_path / "cache").glob("expert-*.npz"))) == 1  # the expert's rollouts, kept
    warm = json.loads((tmp_path / "policy" / "bundle.json").read_text())["metadata"]["warm_start"]
    # Five actions: chance agreement is ~20% (the expert holds most of the time, so a constant
    # "hold" would score higher; cloning must beat that majority baseline too).
    assert warm["action_agreement"] > 0.6
    assert warm["value_r2"] > 0.5


def test_expert_scale_steps_land_closest_in_octaves_hold_near_and_respect_the_mask():
    from dynamix_gym.learning.imitation import expert_steps

    factors = np.array([0.5, 0.8, 1.0, 1.25, 2.0])
    current = np.array([100, 100, 100, 100, 100, 100])
    target = np.array([400.0, 130.0, 105.0, 70.0, 10.0, 190.0])
    idx = expert_steps("scale", current, target, factors, tolerance=0.1)
    assert factors[idx].tolist() == [2.0, 1.25, 1.0, 0.8, 0.5, 2.0]
    legal = np.ones((6, 5), dtype=bool)
    legal[0, 4] = False  # x2 would leave worker 0's range: the best legal step is x5/4
    assert factors[expert_steps("scale", current, target, factors, 0.1, legal)][0] == 1.25
    with np.testing.assert_raises(ValueError):
        expert_steps("absolute", current, target, factors, 0.1)


def test_per_episode_weights_give_every_episode_one_share_and_round_trip(tmp_path):
    from dynamix_gym.learning.imitation import ExpertData

    data = collect_expert_data({}, {"interval": 50, "reward": "time"}, [3], episodes=2, gamma=0.99, seed=0)
    lengths = data.episode_decisions
    assert lengths is not None and len(lengths) == len(data.actions)
    # rows of one episode: 3 workers per decision, each row records its episode's decision count
    assert all(np.sum(lengths == n) % (3 * n) == 0 for n in set(lengths.tolist()))
    w = data.weights(per_episode=True)
    assert np.isclose(w.mean(), 1.0)
    shares = [w[lengths == n].sum() for n in set(lengths.tolist())]
    assert np.allclose(
        shares, shares[0] * np.array([np.sum(lengths == n) / (3 * n) for n in set(lengths.tolist())])
    )
    assert np.array_equal(data.weights(per_episode=False), np.ones(len(w), dtype=np.float32))
    both = data + data
    assert len(both.episode_decisions) == 2 * len(lengths)
    data.save(tmp_path / "d.npz")
    back = ExpertData.load(tmp_path / "d.npz")
    assert not list(tmp_path.glob("*.tmp*"))  # written whole, then renamed
    for field in ("obs", "actions", "returns", "episode_decisions"):
        assert np.array_equal(getattr(back, field), getattr(data, field))
    assert (back.episodes, back.mean_tta_s) == (data.episodes, data.mean_tta_s)


def test_the_expert_cache_is_keyed_by_what_the_rollouts_depend_on(tmp_path):
    from dynamix_gym.learning.training import _expert_cache_path

    collect = {"domain": {"workloads": ["cifar10"]}, "episodes": 4, "seed": 1, "expert": "oracle"}
    a = _expert_cache_path(str(tmp_path), collect)
    assert a == _expert_cache_path(str(tmp_path), dict(reversed(list(collect.items()))))
    assert a != _expert_cache_path(str(tmp_path), {**collect, "episodes": 5})
    assert a != _expert_cache_path(str(tmp_path), {**collect, "domain": {"workloads": ["ncf"]}})
    assert _expert_cache_path(None, collect) is None


def test_the_cloning_term_holds_ppo_near_its_teacher(tmp_path):
    """PPO pushed hard away from its warm start (a large entropy bonus, a high learning rate)
    keeps more of the teacher's actions with the cloning term than without it."""
    import torch

    from dynamix_gym.controllers.bundle import load_bundle
    from dynamix_gym.learning.imitation import ExpertData

    def run(name: str, coef: float) -> Path:
        ppo = {"n_steps": 128, "batch_size": 64, "n_epochs": 4, "learning_rate": 3e-3, "ent_coef": 0.5}
        # both runs clone the same rollouts (the cache)
        train(
            _tiny(
                tmp_path / name,
                1024,
                ppo,
                episodes=3,
                bc_coef=coef,
                bc_steps=20,
                cache_dir=str(tmp_path / "cache"),
            )
        )
        return tmp_path / name

    free, held = run("free", 0.0), run("held", 2.0)
    assert not (free / "expert_data.npz").exists() and (held / "expert_data.npz").exists()
    data = ExpertData.load(held / "expert_data.npz")

    def agreement(run_dir: Path) -> float:
        bundle = load_bundle(run_dir / "policy")
        obs = torch.as_tensor(bundle.obs_norm(data.obs))
        with torch.no_grad():
            acts = bundle.model.policy.get_distribution(obs).get_actions(deterministic=True).numpy()
        return float(np.mean(acts == data.actions))

    assert agreement(held) > agreement(free) + 0.05


def test_a_cloning_term_is_checked_and_a_fine_tune_may_keep_one(tmp_path):
    import pytest

    from dynamix_gym.learning.training import check_train_config

    base = TrainConfig(run_dir=str(tmp_path), expert_pretrain={"expert": "oracle", "bc_coef": 1.0})
    # finetune_from with expert_pretrain: DAgger from the bundle's weights gathers the term's data
    check_train_config(TrainConfig(**{**base.__dict__, "finetune_from": "results/headline/policy"}))
    with pytest.raises(ValueError, match=r"bc_coef must lie in \[0, 100\]"):
        check_train_config(TrainConfig(**{**base.__dict__, "expert_pretrain": {"bc_coef": -1}}))


def test_no_dagger_round_starts_after_the_deadline(tmp_path):
    """``max_train_s`` bounds the warm start too: a deadline already passed leaves the expert's
    cloning alone, and the stats say the clock stopped it."""
    import time

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    from dynamix_gym.learning.training import make_train_venv
    from dynamix_gym.learning.warm_start import warm_start

    cfg = _tiny(
        tmp_path, 0, {"n_steps": 64, "batch_size": 64}, episodes=2, dagger_rounds=2, dagger_episodes=1
    )
    venv = VecNormalize(make_train_venv(cfg))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, policy_kwargs={"net_arch": [8]}, device="cpu")
    kept = venv.obs_rms.mean.copy()
    stats, _ = warm_start(cfg, model, venv, keep_obs_stats=True, deadline=time.perf_counter() - 1.0)
    assert stats["dagger"] == [] and stats["stopped_by_wall_clock"] is True
    np.testing.assert_array_equal(venv.obs_rms.mean, kept)  # a fine-tuned bundle's statistics stay
    stats, _ = warm_start(cfg, model, venv, deadline=time.perf_counter() + 600.0)
    assert len(stats["dagger"]) == 2 and stats["stopped_by_wall_clock"] is False
    assert not np.array_equal(venv.obs_rms.mean, kept)  # a fresh policy's are the expert data's
    venv.close()


def test_the_normaliser_can_weigh_every_episode_alike(tmp_path):
    """``obs_stats_weighting=episode``: the observation statistics are the expert rows' averages with
    each episode one share (a short run counts as much as a long one), against the plain per-decision
    ones by default; a bad value is named."""
    import pytest
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    from dynamix_gym.learning.imitation import ExpertData
    from dynamix_gym.learning.training import make_train_venv
    from dynamix_gym.learning.warm_start import warm_start

    stats = {}
    for weighting in ("decision", "episode"):
        cfg = _tiny(tmp_path, 0, {"n_steps": 64, "batch_size": 64}, episodes=3, epochs=1,
                    cache_dir=str(tmp_path / "cache"), obs_stats_weighting=weighting)  # fmt: skip
        venv = VecNormalize(make_train_venv(cfg))
        model = PPO(
            "MlpPolicy", venv, n_steps=64, batch_size=64, policy_kwargs={"net_arch": [8]}, device="cpu"
        )
        warm_start(cfg, model, venv)
        stats[weighting] = venv.obs_rms.mean.copy(), venv.obs_rms.var.copy()
        venv.close()
    (cache,) = (tmp_path / "cache").glob("expert-*.npz")  # one collection: the weighting is not in its key
    data = ExpertData.load(cache)
    assert len(set(data.episode_decisions.tolist())) > 1  # episodes of different lengths
    np.testing.assert_allclose(stats["decision"][0], data.obs.mean(axis=0))
    w = 1.0 / data.episode_decisions
    mean = (w[:, None] * data.obs).sum(axis=0) / w.sum()
    np.testing.assert_allclose(stats["episode"][0], mean, rtol=1e-5, atol=1e-7)  # float32 rows
    var = (w[:, None] * (data.obs - mean) ** 2).sum(axis=0) / w.sum()
    np.testing.assert_allclose(stats["episode"][1], var, rtol=1e-5, atol=1e-7)  # float32 rows
    assert not np.allclose(stats["episode"][0], stats["decision"][0])
    with pytest.raises(
        ValueError, match=r"expert_pretrain\.obs_stats_weighting must be 'decision' or 'episode'"
    ):
        _tiny(tmp_path, 0, {}, obs_stats_weighting="run")
