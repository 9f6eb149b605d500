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
    with pytest.raises(ValueError, match="unknown split 'even'"):
        BatchedClusterVectorEnv(2, split="even")
    with pytest.raises(ValueError, match="split_tolerance"):
        BatchedClusterVectorEnv(2, split="balanced", split_tolerance=1.5)
    with pytest.raises(ValueError, match="domain_workers has 1 entries"):
        BatchedPerWorkerVecEnv(domain=dict(workers=4), num_clusters=2, domain_workers=[4])
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


# The universal bundle's training setup: schema 3, masked multiplicative steps up to x64, the time
# reward, generated worlds of several sizes in one batch, and the cost-aware balanced split.
UNIVERSAL_ENV = dict(
    obs_schema=3,
    action_mode="scale",
    action_set=[0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 16.0, 64.0],
    reward="time",
    max_decisions=10,
)
UNIVERSAL_DOMAIN = dict(
    gpu_types=("T4", "V100", "RTX2080Ti", "A100"),
    max_types=3,
    workloads=("cifar10", "ncf", "bert"),
    scenarios=("throttle", "loss_rejoin", "congestion_windows"),
    intensity=(0.25, 3.0),
    speed_sd=0.2,
)


@pytest.mark.parametrize("split", ["balanced", "balanced_cost"])
def test_batched_per_worker_env_plays_the_universal_setup_as_the_per_cluster_envs(split):
    sizes = [2, 4, 8, 4]
    kw = dict(UNIVERSAL_ENV, split=split)
    ours = BatchedPerWorkerVecEnv(
        domain=UNIVERSAL_DOMAIN, num_clusters=len(sizes), domain_workers=sizes, noise="stream", **kw
    )
    theirs = PerWorkerVecEnv(
        [lambda n=n: RandomizedClusterEnv(domain=dict(UNIVERSAL_DOMAIN, workers=n), **kw) for n in sizes]
    )
    assert ours.num_envs == theirs.num_envs == sum(sizes)
    assert ours.get_attr("split")[0] == split and ours.get_attr("obs_schema")[0].version == "3"
    ours.seed(7)
    theirs.seed(7)
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    rng = np.random.default_rng(3)
    ends = resplits = 0
    for _ in range(40):
        masks = ours.action_masks()
        np.testing.assert_array_equal(masks, theirs.action_masks())
        # mostly "hold" (index 3: x1), so that the split's own re-splits and holds show
        a = np.where(rng.random(len(masks)) < 0.7, 3, (rng.random(masks.shape) * masks).argmax(axis=1))
        o1, r1, d1, _ = ours.step(a)
        o2, r2, d2, i2 = theirs.step(a)
        np.testing.assert_allclose(o1, o2, atol=2e-6)
        np.testing.assert_allclose(r1, r2, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(d1, d2)
        for c, lo in enumerate(ours.offsets[:-1].tolist()):
            info = i2[lo]["cluster_info"]
            if not d2[lo]:
                n = sizes[c]
                np.testing.assert_array_equal(ours.core.batches[c, :n], info["local_batches"])
                resplits += int(np.any(info["local_batches"] != info["requested_batches"]))
            else:
                ends += 1
    assert ends >= 3 and resplits >= 5  # episodes restarted in the batch; the split moved batches
