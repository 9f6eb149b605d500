"""The trainer on the batched simulator (``vec_env=batched``): the same worlds and rules, one batch."""

from __future__ import annotations

import numpy as np
import pytest
from support import tiny

from dynamix_gym.controllers.bundle import load_bundle
from dynamix_gym.envs.batched_per_worker import BatchedPerWorkerVecEnv
from dynamix_gym.learning.training import make_train_venv, train

UNIVERSAL = dict(
    algorithm="maskable_ppo",
    action_mode="scale",
    env={
        "interval": 50,
        "reward": {"kind": "time"},
        "max_decisions": 20,
        "obs_schema": 3,
        "action_set": [0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 16.0, 64.0],
        "split": "balanced_cost",
    },
    domain={"gpu_types": ("T4", "V100", "A100"), "workloads": ("cifar10", "ncf")},
)


def test_batched_vec_env_holds_every_cluster_size_copies_times(tmp_path):
    cfg = tiny(tmp_path, vec_env="batched", batched_copies=3, cluster_sizes=(2, 4), **UNIVERSAL)
    venv = make_train_venv(cfg)
    inner = venv.venv
    assert isinstance(inner, BatchedPerWorkerVecEnv)
    assert inner.sizes == [2, 4] * 3 and venv.num_envs == 18
    assert inner.get_attr("split")[0] == "balanced_cost" and inner.schema.version == "3"
    obs = venv.reset()
    assert obs.shape == (18, inner.schema.per_worker_dim)
    masks = inner.action_masks()
    _, rewards, _, _ = venv.step((np.random.default_rng(0).random(masks.shape) * masks).argmax(axis=1))
    # every worker of a cluster gets its cluster's reward
    for lo, hi in zip(inner.offsets[:-1], inner.offsets[1:], strict=True):
        assert np.all(rewards[lo:hi] == rewards[lo])


def test_batched_training_makes_a_bundle_of_the_setup_and_reproduces_with_a_seed(tmp_path):
    cfg = dict(vec_env="batched", batched_copies=2, total_timesteps=600, checkpoint_every=10**9, **UNIVERSAL)
    a = train(tiny(tmp_path / "a", **cfg))
    b = load_bundle(train(tiny(tmp_path / "b", **cfg))["final_bundle"])
    meta = load_bundle(a["final_bundle"]).meta
    assert a["timesteps"] >= 600
    assert (meta.split, meta.schema_version, meta.action_mode) == ("balanced_cost", "3", "scale")
    for pa, pb in zip(
        load_bundle(a["final_bundle"]).model.policy.parameters(), b.model.policy.parameters(), strict=True
    ):
        np.testing.assert_array_equal(pa.detach().numpy(), pb.detach().numpy())


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(vec_env="gpu"), "vec_env"),
        (dict(vec_env="batched", batched_copies=0), "batched_copies must be an integer >= 1"),
        (dict(vec_env="batched", obs_form="centralised"), "vec_env=batched needs obs_form=per_worker"),
        (dict(vec_env="batched", time_scale="world"), "vec_env=batched needs time_scale=fixed"),
        (dict(vec_env="batched", subprocess=True), "vec_env=batched needs subprocess=false"),
        (
            dict(vec_env="batched", env={"interval": 50, "reward": {"kind": "time"}, "backend": None}),
            r"env\.backend is not a keyword of BatchedClusters",
        ),
    ],
)
def test_batched_settings_that_cannot_train_are_refused_by_name(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        train(tiny(tmp_path, **overrides))
