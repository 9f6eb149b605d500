"""The centralised critic (MAPPO-style): the cluster state, an actor blind to it, fine-tuning from
a local-critic bundle, and the places that refuse it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import tiny

from dynamix_gym import HeteroClusterEnv
from dynamix_gym.controllers.bundle import BundleMismatchError, PPOController, load_bundle
from dynamix_gym.evaluation import run_episode
from dynamix_gym.learning.central_critic import critic_state_dim, with_critic_state
from dynamix_gym.learning.training import check_train_config, train
from dynamix_gym.obs import OBS_SCHEMA_V3

SCALE = dict(algorithm="maskable_ppo", action_mode="scale", checkpoint_every=10**9)


def test_the_critic_state_is_the_clusters_mean_min_and_max_of_each_worker_feature():
    rng = np.random.default_rng(0)
    fw = OBS_SCHEMA_V3.worker_dim
    for n in (2, 5):
        rows = rng.normal(size=(n, OBS_SCHEMA_V3.per_worker_dim)).astype(np.float32)
        out = with_critic_state(rows, fw)
        assert out.shape == (n, OBS_SCHEMA_V3.per_worker_dim + critic_state_dim(fw))
        np.testing.assert_array_equal(out[:, : rows.shape[1]], rows)
        state = out[:, rows.shape[1] :]
        assert np.all(state == state[0])  # one state for every worker of the cluster
        np.testing.assert_allclose(state[0, :fw], rows[:, :fw].mean(axis=0), rtol=1e-6)
        np.testing.assert_array_equal(state[0, fw : 2 * fw], rows[:, :fw].min(axis=0))
        np.testing.assert_array_equal(state[0, 2 * fw :], rows[:, :fw].max(axis=0))


def test_the_actor_ignores_the_state_the_critic_reads_it_and_fine_tuning_starts_from_the_bundle(tmp_path):
    base = train(tiny(tmp_path / "base", total_timesteps=300, **SCALE))["final_bundle"]
    # Critic warm-up longer than the run: the actor is the bundle's, the critic learns.
    central = train(
        tiny(
            tmp_path / "central",
            finetune_from=base,
            critic="centralised",
            critic_warmup_steps=10**6,
            total_timesteps=400,
            **SCALE,
        )
    )["final_bundle"]
    bundle = load_bundle(central)
    assert (
        bundle.meta.critic == "centralised"
        and type(bundle.model.policy).__name__ == "MaskableCentralCriticPolicy"
    )
    d = bundle.meta.feature_names and len(bundle.meta.feature_names)
    assert bundle.obs_norm.mean.shape == (d + critic_state_dim(19),)
    policy = bundle.model.policy
    x = torch.zeros((3, bundle.obs_norm.mean.shape[0]))
    y = x.clone()
    y[:, d:] = torch.randn(3, x.shape[1] - d)  # another cluster state, the same rows
    with torch.no_grad():
        logits = [
            policy.action_net(policy.mlp_extractor.forward_actor(policy.pi_features_extractor(v)))
            for v in (x, y)
        ]
        torch.testing.assert_close(logits[0], logits[1])
        # the critic starts as the bundle's own (zero weights on the state) and then learns to read it
        assert not torch.equal(policy.predict_values(x), policy.predict_values(y))
    # the same actor as the bundle's: the same decisions on a cluster of a size it never trained on
    runs = [
        run_episode(
            HeteroClusterEnv(workers=5, max_decisions=6, action_mode="scale"), PPOController(p), seed=1
        )
        for p in (base, central)
    ]
    assert runs[0].summary["total_time_s"] == runs[1].summary["total_time_s"]
    with pytest.raises(ValueError, match="critic"):  # a centralised bundle fine-tuned as a local one
        train(tiny(tmp_path / "again", finetune_from=central, total_timesteps=100, **SCALE))


def test_a_fresh_centralised_critic_trains_and_bad_combinations_are_refused(tmp_path):
    run = dict(SCALE, checkpoint_every=150)
    result = train(tiny(tmp_path / "fresh", critic="centralised", total_timesteps=300, **run))
    assert load_bundle(result["final_bundle"]).meta.critic == "centralised"
    resumed = train(
        tiny(tmp_path / "fresh", critic="centralised", total_timesteps=600, **run)
    )  # from its checkpoint
    assert resumed["timesteps"] >= 600 and load_bundle(resumed["final_bundle"]).meta.critic == "centralised"
    with pytest.raises(ValueError, match="critic=centralised cannot be warm-started"):
        check_train_config(tiny(tmp_path / "x", critic="centralised", expert_pretrain={"episodes": 2}))
    with pytest.raises(ValueError, match="obs_form=per_worker"):
        check_train_config(tiny(tmp_path / "x", critic="centralised", obs_form="centralised"))
    with pytest.raises(ValueError, match="critic"):
        check_train_config(tiny(tmp_path / "x", critic="global"))


def test_the_arbitrator_refuses_a_centralised_critic_bundle(tmp_path):
    from dynamix_gym.service.server import PolicyStore

    path = train(tiny(tmp_path / "c", critic="centralised", total_timesteps=200, **SCALE))["final_bundle"]
    with pytest.raises(BundleMismatchError, match="local critic"):
        PolicyStore({"c": load_bundle(path)})
