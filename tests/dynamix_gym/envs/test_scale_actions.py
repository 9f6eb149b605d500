"""Scale-free actions (action_mode="scale"): multiplicative steps, action masks at the workers'
bounds, and sb3-contrib's MaskablePPO on the centralised and per-worker forms."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env as gym_check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sb3_contrib import MaskablePPO
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from dynamix_gym import HeteroClusterEnv, PerWorkerEnv
from dynamix_gym.controllers.bundle import BundleMeta, BundleMismatchError, PPOController, save_bundle
from dynamix_gym.envs.hetero_cluster import DEFAULT_SCALE_SET
from dynamix_gym.envs.vec_env import PerWorkerVecEnv
from dynamix_gym.evaluation import run_episode


def _plain_mask(batches, spec, mode, steps) -> list[list[bool]]:
    out = []
    for i, b in enumerate(batches.tolist()):
        lo, hi = int(spec.min_batch[i]), int(spec.max_batch[i])
        row = []
        for s in steps:
            new = b + s if mode == "delta" else round(b * s)  # round: half to even, as np.rint
            row.append(lo <= new <= hi)
        out.append(row)
    return out


def test_scale_steps_multiply_the_batch():
    env = HeteroClusterEnv(workers=5, action_mode="scale", initial_batch=100)
    assert env.action_set.tolist() == list(DEFAULT_SCALE_SET)
    assert env.action_space.nvec.tolist() == [5] * 5
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.arange(5))
    assert info["local_batches"].tolist() == [50, 80, 100, 125, 200] and info["clipped"] == []


def test_masks_at_the_bounds_and_clipping_of_an_unmasked_step():
    env = HeteroClusterEnv(workers=2, action_mode="scale")
    spec = env.backend.spec
    lo, hi = spec.min_batch.tolist(), spec.max_batch.tolist()
    env.reset(seed=0, options={"initial_batches": [lo[0], hi[1]]})
    masks = env.action_mask_matrix()
    # at the minimum: x1/2 and x4/5 would leave the range; at the memory cap: x5/4 and x2
    assert masks.tolist() == [[False, False, True, True, True], [True, True, True, False, False]]
    assert env.action_masks().tolist() == masks.reshape(-1).tolist() and env.action_masks().dtype == bool
    _, _, _, _, info = env.step(np.array([0, 4]))  # both masked: clipped and listed, never silent
    assert info["clipped"] == [
        {"worker": 0, "requested": round(lo[0] * 0.5), "applied": lo[0]},
        {"worker": 1, "requested": hi[1] * 2, "applied": hi[1]},
    ]
    delta = HeteroClusterEnv(workers=2, initial_batch=32)
    delta.reset(seed=0)
    assert delta.action_mask_matrix().tolist() == [[False, False, True, True, True]] * 2  # 32 - 25 < 16


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["delta", "scale"]),
    fractions=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
    workload=st.sampled_from(["cifar10", "bert", "ncf"]),
)
def test_masks_match_a_plain_range_check_for_any_batches(mode, fractions, workload):
    env = HeteroClusterEnv(workers=3, workload=workload, action_mode=mode)
    spec = env.backend.spec
    b = np.rint(spec.min_batch + np.array(fractions) * (spec.max_batch - spec.min_batch)).astype(int)
    env.reset(seed=1, options={"initial_batches": b})
    expected = _plain_mask(env.batches, spec, mode, env.action_set.tolist())
    assert env.action_mask_matrix().tolist() == expected
    before = env.batches.copy()
    legal = np.array([row.index(True) if any(row) else 0 for row in expected])
    _, _, _, _, info = env.step(legal)
    assert info["clipped"] == []  # the keep step (0 or x1) is always legal
    assert np.all(info["local_batches"] >= spec.min_batch) and before.shape == (3,)


def test_masks_refused_outside_discrete_modes_and_before_reset():
    with pytest.raises(RuntimeError, match="before reset"):
        HeteroClusterEnv(workers=2, action_mode="scale").action_masks()
    env = HeteroClusterEnv(workers=2, action_mode="continuous")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"discrete action modes \['delta', 'scale'\].*'continuous'"):
        env.action_masks()


@pytest.mark.parametrize(
    ("action_set", "match"),
    [
        ((0.5, 2.0), "must contain 1"),
        ((0.5, 1.0, 1.0), "two distinct scale factors"),
        ((-0.5, 1.0), "finite and > 0"),
        ((1.0, float("inf")), "finite and > 0"),
        (("half", 1.0), "must be numbers"),
    ],
)
def test_bad_scale_sets_name_the_field(action_set, match):
    with pytest.raises(ValueError, match=match):
        HeteroClusterEnv(workers=2, action_mode="scale", action_set=action_set)


@pytest.mark.parametrize(
    "make",
    [
        lambda: HeteroClusterEnv(workers=3, action_mode="scale", scenario="mixed"),
        lambda: PerWorkerEnv(workers=3, action_mode="scale", obs_schema=2),
    ],
    ids=["centralised", "per-worker"],
)
def test_scale_envs_pass_the_checkers(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(make(), skip_render_check=True)
        sb3_check_env(make(), warn=True)


def test_per_worker_env_masks_the_worker_whose_turn_it_is():
    env = PerWorkerEnv(workers=2, action_mode="scale")
    spec = env.cluster_env.backend.spec
    env.reset(seed=0, options={"initial_batches": [spec.min_batch[0], spec.max_batch[1]]})
    assert env.action_masks().tolist() == [False, False, True, True, True]
    env.step(2)
    assert env.action_masks().tolist() == [True, True, True, False, False]
    with pytest.raises(ValueError, match=r"action_mode in \['delta', 'scale'\]"):
        PerWorkerEnv(workers=2, action_mode="absolute")


class NoClipping(BaseCallback):
    """Fails the run if any applied step was clipped: the masks must keep every step legal."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            info = info.get("cluster_info", info)
            assert info.get("clipped", []) == [], info["clipped"]
        self.steps += 1
        return True


def test_maskable_ppo_trains_on_the_scale_env_without_a_clipped_step():
    torch.manual_seed(0)
    # Start at the bounds, where half the steps are illegal, and keep episodes short.
    env = HeteroClusterEnv(workers=4, action_mode="scale", obs_schema=2, max_decisions=16, initial_batch=16)
    model = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    cb = NoClipping()
    model.learn(total_timesteps=256, callback=cb)
    assert model.num_timesteps >= 256 and cb.steps >= 256
    obs, _ = env.reset(seed=5)
    for _ in range(10):
        action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
        obs, _, term, trunc, info = env.step(action)
        assert info["clipped"] == []
        if term or trunc:
            obs, _ = env.reset()


def test_maskable_ppo_trains_on_the_per_worker_vec_env():
    torch.manual_seed(0)

    def make(n: int):
        return lambda: HeteroClusterEnv(workers=n, action_mode="scale", max_decisions=8, initial_batch=16)

    vec = PerWorkerVecEnv([make(2), make(3)])
    assert vec.action_mode == "scale" and vec.has_attr("action_masks")
    vec.seed(0)
    vec.reset()
    rows = np.stack(vec.env_method("action_masks"))
    assert rows.shape == (5, 5) and rows.dtype == bool
    assert rows.tolist() == [[False, False, True, True, True]] * 5  # every worker at its minimum 16
    model = MaskablePPO("MlpPolicy", vec, n_steps=64, batch_size=80, n_epochs=1, seed=0, device="cpu")
    cb = NoClipping()
    model.learn(total_timesteps=320, callback=cb)
    assert model.num_timesteps >= 320
    with pytest.raises(ValueError, match="one action mode and set"):
        PerWorkerVecEnv([make(2), lambda: HeteroClusterEnv(workers=2)])


def test_a_scale_bundle_refuses_a_delta_env(tmp_path):
    vec = PerWorkerVecEnv([lambda: HeteroClusterEnv(workers=2, action_mode="scale", max_decisions=2)])
    model = PPO("MlpPolicy", vec, n_steps=8, batch_size=8, seed=0, device="cpu")
    meta = BundleMeta(obs_form="per_worker", action_set=list(DEFAULT_SCALE_SET), action_mode="scale")
    controller = PPOController(save_bundle(tmp_path / "b", model, meta, None))
    assert controller.action_mode == "scale"
    res = run_episode(HeteroClusterEnv(workers=3, action_mode="scale", max_decisions=2), controller, seed=0)
    assert res.summary["decisions"] == 2
    with pytest.raises(ValueError, match="emits 'scale' actions"):
        run_episode(HeteroClusterEnv(workers=3, max_decisions=2), controller, seed=0)
    env = HeteroClusterEnv(workers=3, action_mode="scale", action_set=(0.5, 1.0, 2.0), max_decisions=2)
    with pytest.raises(BundleMismatchError, match=r"batch factors \[0.5, 0.8, 1, 1.25, 2\]"):
        run_episode(env, controller, seed=0)


def test_a_maskable_ppo_bundle_drives_a_scale_env_within_the_bounds(tmp_path):
    """A MaskablePPO bundle loads as such, and the controller masks from the batches in force and
    the spec alone: sampled steps from the minimum batch are never clipped."""
    vec = PerWorkerVecEnv([lambda: HeteroClusterEnv(workers=2, action_mode="scale", obs_schema=2)])
    model = MaskablePPO("MlpPolicy", vec, n_steps=8, batch_size=8, seed=0, device="cpu")
    meta = BundleMeta(
        obs_form="per_worker",
        action_set=list(DEFAULT_SCALE_SET),
        action_mode="scale",
        algorithm="maskable_ppo",
        schema_version="2",
    )
    controller = PPOController(save_bundle(tmp_path / "b", model, meta, None), deterministic=False)
    assert isinstance(controller.bundle.model, MaskablePPO)
    env = HeteroClusterEnv(workers=4, action_mode="scale", obs_schema=2, initial_batch=16, max_decisions=12)
    controller.check_env(env)
    obs, info = env.reset(seed=3)
    controller.reset(env.backend.spec, np.random.default_rng(3))
    chosen = set()
    for _ in range(12):
        action, _ = controller.predict(obs, info)
        chosen |= set(action.tolist())
        obs, _, term, trunc, info = env.step(action)
        assert info["clipped"] == []
        if term or trunc:
            break
    assert len(chosen) >= 3  # it sampled, and was steered away from the illegal steps
    with pytest.raises(ValueError, match="algorithm must be one of"):
        BundleMeta(obs_form="per_worker", action_set=[0, 1], algorithm="dqn")
