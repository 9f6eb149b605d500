"""The PettingZoo form: PettingZoo's parallel API test, seeded rollouts, and the very observations,
rewards and masks of the wrapped HeteroClusterEnv."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from pettingzoo.test import parallel_api_test, parallel_seed_test

from dynamix_gym import HeteroClusterEnv
from dynamix_gym.envs.parallel_cluster import ParallelClusterEnv, parallel_env
from dynamix_gym.obs import OBS_SCHEMA_V2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 3, "max_decisions": 12, "scenario": "mixed"},
        {"workers": 4, "max_decisions": 12, "action_mode": "scale", "obs_schema": 2, "workload": "bert"},
    ],
    ids=["delta-schema1", "scale-schema2-bert"],
)
def test_pettingzoo_parallel_api_test_passes_without_warnings(kwargs, caplog):
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        parallel_api_test(parallel_env(**kwargs), num_cycles=100)
    # the API test's reset(options={"options": 1}) is logged, not silently dropped
    assert "ignores unknown options ['options']" in caplog.text


def test_pettingzoo_seed_test_passes():
    parallel_seed_test(
        lambda: ParallelClusterEnv(workers=3, max_decisions=10, scenario="jitter"), num_cycles=30
    )


def _rollout(env: ParallelClusterEnv, seed: int, steps: int) -> list:
    obs, infos = env.reset(seed=seed)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)
    out = [obs, [infos[a]["action_mask"] for a in env.possible_agents]]
    for _ in range(steps):
        actions = {
            a: env.action_space(a).sample(mask=infos[a]["action_mask"].astype(np.int8)) for a in env.agents
        }
        obs, rewards, terms, truncs, infos = env.step(actions)
        out.append((obs, rewards, terms, truncs, infos[env.possible_agents[0]]["local_batches"]))
        if not env.agents:
            obs, infos = env.reset()
            out.append(obs)
    return out


def test_same_seed_same_rollout():
    make = lambda: ParallelClusterEnv(workers=4, scenario="mixed", action_mode="scale", max_decisions=15)  # noqa: E731
    a, b, c = _rollout(make(), 7, 40), _rollout(make(), 7, 40), _rollout(make(), 8, 40)
    assert data_equivalence(a, b)
    assert not data_equivalence(a, c)


def test_agents_see_the_wrapped_envs_rows_reward_and_masks():
    par = ParallelClusterEnv(workers=3, obs_schema=2, action_mode="scale", initial_batch=16)
    ref = HeteroClusterEnv(workers=3, obs_schema=2, action_mode="scale", initial_batch=16)
    obs, infos = par.reset(seed=4)
    ref.reset(seed=4)
    assert par.possible_agents == ["worker_0", "worker_1", "worker_2"]
    assert par.observation_space("worker_1").shape == (OBS_SCHEMA_V2.per_worker_dim,)
    assert par.state_space.shape == (OBS_SCHEMA_V2.centralised_dim(3),)
    for step in range(5):
        rows = ref.per_worker_observations()
        masks = ref.action_mask_matrix()
        for i, agent in enumerate(par.possible_agents):
            assert np.array_equal(obs[agent], rows[i])
            assert infos[agent]["action_mask"].tolist() == masks[i].tolist()
            assert infos[agent]["worker"] == i
        assert np.array_equal(par.state(), ref._obs())
        joint = np.array([4, 2, 0 if step else 1])  # x2, x1 and x4/5 then x1/2: masked at 16, clipped
        obs, rewards, _, _, infos = par.step({a: int(joint[i]) for i, a in enumerate(par.agents)})
        _, reward, _, _, info = ref.step(joint)
        assert set(rewards.values()) == {reward}
        assert infos["worker_2"]["clipped"] == [c for c in info["clipped"] if c["worker"] == 2] != []
        assert infos["worker_0"]["clipped"] == []


def test_episode_end_empties_agents_and_bad_input_is_refused():
    env = ParallelClusterEnv(workers=2, max_decisions=2)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step({"worker_0": 2, "worker_1": 2})
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"missing \['worker_1'\], unknown \['worker_9'\]"):
        env.step({"worker_0": 2, "worker_9": 2})
    with pytest.raises(ValueError, match=r"actions\['worker_1'\] = 7 is outside Discrete\(5\)"):
        env.step({"worker_0": 2, "worker_1": 7})
    with pytest.raises(ValueError, match="unknown agent 'worker_5'"):
        env.action_space("worker_5")
    _, _, terms, truncs, _ = env.step({"worker_0": 2, "worker_1": 2})
    assert env.agents == ["worker_0", "worker_1"] and not any(truncs.values())
    _, _, terms, truncs, _ = env.step({"worker_0": 2, "worker_1": 2})
    assert env.agents == [] and all(truncs.values()) and not any(terms.values())
    with pytest.raises(ValueError, match=r"action_mode in \['delta', 'scale'\]"):
        ParallelClusterEnv(workers=2, action_mode="continuous")
