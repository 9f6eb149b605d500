"""Observation schema 3: schema 2's features unchanged, plus the job's learning-rate regime read
from its spec (checked against a plain reference), and the spec's ``lr_rule`` checked by name."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from stable_baselines3 import PPO

from dynamix_gym import HeteroClusterEnv
from dynamix_gym.controllers.bundle import BundleMeta, BundleMismatchError, PPOController, save_bundle
from dynamix_gym.envs.vec_env import PerWorkerVecEnv
from dynamix_gym.evaluation import run_episode
from dynamix_gym.obs import OBS_SCHEMA_V2, OBS_SCHEMA_V3, RegimeAwareEncoder, get_schema, make_encoder


def _scaled(value: float, low: float, high: float) -> float:
    return -1.0 + 2.0 * (min(max(value, low), high) - low) / (high - low)


@pytest.mark.parametrize("workload", ["cifar10", "cifar100_resnet34", "ncf"])
def test_schema3_is_schema2_plus_the_regime(workload):
    assert get_schema(3) is OBS_SCHEMA_V3 and OBS_SCHEMA_V3.version == "3"
    assert OBS_SCHEMA_V3.worker_features == OBS_SCHEMA_V2.worker_features
    assert OBS_SCHEMA_V3.global_features[: OBS_SCHEMA_V2.global_dim] == OBS_SCHEMA_V2.global_features
    assert [f.name for f in OBS_SCHEMA_V3.global_features[OBS_SCHEMA_V2.global_dim :]] == [
        "lr_scaled",
        "batch_to_base",
    ]
    envs = {
        v: HeteroClusterEnv(workers=4, workload=workload, obs_schema=v, scenario="throttle") for v in (2, 3)
    }
    assert isinstance(envs[3].encoder, RegimeAwareEncoder)
    spec = envs[3].backend.spec
    assert spec.lr_rule == ("none" if workload == "cifar100_resnet34" else "adascale")
    obs = {v: e.reset(seed=4)[0] for v, e in envs.items()}
    rng = np.random.default_rng(0)
    for _ in range(6):
        dim2 = obs[2].shape[0]
        np.testing.assert_array_equal(obs[3][:dim2], obs[2])  # schema 2's features, untouched
        lr_scaled, batch_to_base = obs[3][dim2:]
        assert lr_scaled == _scaled(0.0 if spec.lr_rule == "none" else 1.0, 0.0, 1.0)
        m = float(envs[3].last_report.global_batch)
        assert batch_to_base == pytest.approx(_scaled(math.log2(m / spec.base_batch), -6.0, 10.0), abs=1e-6)
        action = rng.integers(0, envs[3].action_space.nvec)
        obs = {v: e.step(action)[0] for v, e in envs.items()}


def test_lr_rule_of_a_spec_is_checked_by_name():
    spec = HeteroClusterEnv(workers=2).backend.spec
    assert isinstance(make_encoder("3", spec), RegimeAwareEncoder)
    with pytest.raises(
        ValueError, match=r"BackendSpec\.lr_rule must be one of \['adascale', 'linear', 'sqrt', 'none'\]"
    ):
        dataclasses.replace(spec, lr_rule="cubic")


def test_a_schema3_bundle_runs_on_schema3_and_refuses_schema2(tmp_path):
    vec = PerWorkerVecEnv([lambda: HeteroClusterEnv(workers=3, obs_schema=3, max_decisions=3)])
    assert vec.observation_space.shape == (OBS_SCHEMA_V3.per_worker_dim,)
    model = PPO("MlpPolicy", vec, n_steps=8, batch_size=8, seed=0, device="cpu")
    meta = BundleMeta(obs_form="per_worker", action_set=[-100, -25, 0, 25, 100], schema_version="3")
    path = save_bundle(tmp_path / "b", model, meta, None)
    controller = PPOController(path)
    env = HeteroClusterEnv(workers=4, obs_schema=3, max_decisions=3, workload="cifar100_resnet34")
    assert run_episode(env, controller, seed=0).summary["decisions"] == 3
    with pytest.raises(BundleMismatchError, match=r"schema '3'.*obs_schema=3"):
        run_episode(HeteroClusterEnv(workers=4, obs_schema=2, max_decisions=3), controller, seed=0)
