"""The batched vector envs against the per-cluster envs they stand for (same seeds, same episodes)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import dynamix_gym  # noqa: F401  (registers the ids)
from dynamix_gym.envs.batched_per_worker import BatchedPerWorkerVecEnv
from dynamix_gym.envs.batched_vector import BatchedClusterVectorEnv
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.randomized import RandomizedClusterEnv
from dynamix_gym.envs.vec_env import PerWorkerVecEnv


def _actions(rng, env, mode, n_envs, n):
    if mode == "continuous":
        return rng.uniform(-1, 1, (n_envs, n)).astype(np.float32)
    masks = env.action_masks().reshape(n_envs, n, -1)
    # a masked random policy: any legal step, uniformly
    pick = rng.random(masks.shape) * masks
    return pick.argmax(axis=2)


def _play(vec, envs, steps, mode, seed, n):
    rng = np.random.default_rng(1)
    obs, _ = vec.reset(seed=seed)
    ref = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    np.testing.assert_array_equal(obs, ref)
    ends = 0
    for _ in range(steps):
        a = _actions(rng, vec, mode, len(envs), n)
        if mode != "continuous":
            expected = np.stack([e.action_masks() for e in envs])
            np.testing.assert_array_equal(vec.action_masks(), expected)
        obs, reward, term, trunc, info = vec.step(a)
        for i, e in enumerate(envs):
            o, r, te, tr, _ = e.step(a[i])
            assert (te, tr) == (bool(term[i]), bool(trunc[i]))
            assert r == pytest.approx(reward[i], rel=1e-9, abs=1e-12)
            if te or tr:
                ends += 1
                np.testing.assert_allclose(info["final_obs"][i], o, atol=2e-6)
                o, _ = e.reset()
            np.testing.assert_allclose(obs[i], o, atol=2e-6)
    return ends


@pytest.mark.parametrize(
    "mode, scenario, reward",
    [("delta", "mixed", "dynamix"), ("scale", "loss_rejoin", "time"), ("continuous", "jitter", "dynamix")],
)
def test_vector_env_plays_the_per_cluster_episodes(mode, scenario, reward):
    kw = dict(workers=8, scenario=scenario, action_mode=mode, reward=reward, max_decisions=25)
    vec = BatchedClusterVectorEnv(5, noise="stream", **kw)
    envs = [HeteroClusterEnv(**kw) for _ in range(5)]
    assert _play(vec, envs, 60, mode, seed=3, n=8) >= 5  # episodes ended and restarted in the batch


def test_mixed_worlds_in_one_batch_and_schema_2():
    worlds = [dict(scenario=s, workers=4) for s in ("throttle", "interference", "short_throttles")]
    worlds.append(dict(scenario="mixed", workers=4, workload="imagenet"))
    vec = BatchedClusterVectorEnv(4, worlds=worlds, noise="stream", obs_schema=2, max_decisions=15)
    envs = [HeteroClusterEnv(**w, obs_schema=2, max_decisions=15) for w in worlds]
    _play(vec, envs, 30, "delta", seed=11, n=4)


@pytest.mark.parametrize(
    "extra",
    [
        dict(throttle_windows=2),
        # generated compute curves, learning-rate limits, compound fault worlds, several workloads
        dict(
            compute_sd=0.2,
            exponent_scale=(0.8, 1.3),
            lr_limit_probability=0.7,
            compound_probability=0.5,
            workloads=("cifar10", "imagenet", "ncf"),
        ),
    ],
)
def test_domain_draws_new_worlds_at_reset_without_leaving_the_batch(extra):
    domain = dict(workers=6, scenarios=("throttle", "mixed", "loss_rejoin"), **extra)
    vec = BatchedClusterVectorEnv(3, domain=domain, noise="stream", max_decisions=8)
    envs = [RandomizedClusterEnv(domain=domain, max_decisions=8) for _ in range(3)]
    seen = set()
    rng = np.random.default_rng(0)
    vec.reset(seed=20)
    for i, e in enumerate(envs):
        e.reset(seed=20 + i)
    for _ in range(40):
        a = _actions(rng, vec, "delta", 3, 6)
        obs, reward, _term, _trunc, _ = vec.step(a)
        for i, e in enumerate(envs):
            o, r, te, tr, _ = e.step(a[i])
            assert r == pytest.approx(reward[i], rel=1e-9, abs=1e-12)
            if te or tr:
                o, info = e.reset()
                seen.add(info["domain"]["cluster"])
                assert vec.core.episode_config[i]["cluster"].name == info["domain"]["cluster"]
            np.testing.assert_allclose(obs[i], o, atol=2e-6)
    assert len(seen) > 2  # several worlds were drawn


def test_make_vec_builds_the_batched_env_with_masks():
    vec = gym.make_vec(
        "dynamix/HeteroCluster-v0", num_envs=4, vectorization_mode="vector_entry_point", workers=8
    )
    assert isinstance(vec.unwrapped, BatchedClusterVectorEnv)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (4, 8 * 19 + 13) and obs.dtype == np.float32
    assert vec.observation_space.contains(obs)
    masks = vec.unwrapped.action_masks()
    assert masks.shape == (4, 8 * 5) and masks.dtype == bool
    obs, reward, _term, _trunc, _info = vec.step(vec.action_space.sample())
    assert reward.shape == (4,) and np.all(np.isfinite(reward))
    assert vec.observation_space.contains(obs)


def test_bad_configurations_are_refused_by_name():
    with pytest.raises(ValueError, match="same worker count"):
        BatchedClusterVectorEnv(2, worlds=[dict(workers=4), dict(workers=8)])
    with pytest.raises(ValueError, match="split='balanced'"):
        BatchedClusterVectorEnv(2, split="balanced")
    with pytest.raises(ValueError, match="absolute"):
        BatchedClusterVectorEnv(2, action_mode="absolute")
    with pytest.raises(ValueError, match="num_envs"):
        BatchedClusterVectorEnv(0)
    vec = BatchedClusterVectorEnv(2, workers=4)
    vec.reset(seed=0)
    with pytest.raises(ValueError, match=r"step indices in \[0, 4\]"):
        vec.step(np.full((2, 4), 7))
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 4\)"):
        vec.step(np.zeros((2, 3), dtype=int))


def test_per_worker_vec_env_matches_per_worker_vec_env_with_mixed_sizes():
    worlds = [dict(workers=4, scenario="mixed"), dict(workers=8, scenario="throttle"), dict(workers=2)]
    kw = dict(max_decisions=12, action_mode="scale")
    ours = BatchedPerWorkerVecEnv(worlds, noise="stream", critic_state=True, **kw)
    theirs = PerWorkerVecEnv([lambda w=w: HeteroClusterEnv(**w, **kw) for w in worlds], critic_state=True)
    assert ours.num_envs == theirs.num_envs == 14
    assert ours.observation_space == theirs.observation_space
    ours.seed(5)
    theirs.seed(5)
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    rng = np.random.default_rng(2)
    done_seen = 0
    for _ in range(30):
        masks = ours.action_masks()
        np.testing.assert_array_equal(masks, theirs.action_masks())
        a = (rng.random(masks.shape) * masks).argmax(axis=1)
        o1, r1, d1, i1 = ours.step(a)
        o2, r2, d2, i2 = theirs.step(a)
        np.testing.assert_allclose(o1, o2, atol=2e-6)
        np.testing.assert_allclose(r1, r2, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(d1, d2)
        for x, y in zip(i1, i2, strict=True):
            if "terminal_observation" in y:
                done_seen += 1
                np.testing.assert_allclose(x["terminal_observation"], y["terminal_observation"], atol=2e-6)
    assert done_seen >= 14


def test_maskable_ppo_trains_on_the_batched_per_worker_env():
    sb3_contrib = pytest.importorskip("sb3_contrib")
    env = BatchedPerWorkerVecEnv([dict(workers=4), dict(workers=2)], max_decisions=5)
    model = sb3_contrib.MaskablePPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0)
    model.learn(total_timesteps=96)
    assert model.num_timesteps >= 96
