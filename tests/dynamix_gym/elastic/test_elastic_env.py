"""dynamix/ElasticCluster-v0: checkers, determinism, reward terms, preemptions, restarts, and the
engine's behaviour unchanged while every worker is held."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import dynamix_gym  # noqa: F401  (registers the envs)
from dynamix_gym.elastic.pools import get_pool
from dynamix_gym.elastic.training import ALGO_FORM
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from sim.engine import Simulator
from sim.specs_io import spec_to_dict

KEEP = {"workers": np.full(4, 2), "lr": np.array([1.0], np.float32)}


@pytest.mark.parametrize("form", ["dict", "multidiscrete", "box"])
def test_gymnasium_and_sb3_checkers_pass(form):
    env = gym.make("dynamix/ElasticCluster-v0", action_form=form, max_decisions=4)
    if form == "dict":  # its lr is the multiplier itself, by design (the env's Action Space section)
        with pytest.warns(UserWarning, match="symmetric and normalized space"):
            check_env(env.unwrapped, skip_render_check=True)
    else:
        check_env(env.unwrapped, skip_render_check=True)
    if form != "dict":  # SB3 takes the flat forms
        sb3_check_env(ElasticClusterEnv(action_form=form, max_decisions=4), warn=False)
    env.close()


@pytest.mark.parametrize("form", sorted(set(ALGO_FORM.values())))
def test_the_forms_sb3_learners_get_pass_both_checkers_without_an_action_space_warning(form):
    """SAC / TD3's box and PPO's multidiscrete form: no warning about the action space (the box's
    learning-rate part is normalised to [-1, 1], as SB3 recommends)."""
    env = ElasticClusterEnv(action_form=form, max_decisions=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
        sb3_check_env(ElasticClusterEnv(action_form=form, max_decisions=4), warn=True)
    about_actions = [str(w.message) for w in caught if "action" in str(w.message).lower()]
    assert about_actions == []
    if form == "box":
        assert (env.action_space.low == -1).all() and (env.action_space.high == 1).all()


def test_the_box_lr_maps_onto_the_multiplier_range_and_the_dict_lr_is_the_multiplier():
    env = ElasticClusterEnv(action_form="box", batch_action="none", max_decisions=4)
    for a, lr in ((-1.0, 0.8), (0.0, 1.0), (1.0, 1.25)):
        action = np.zeros(env.action_space.shape, np.float32)
        action[-1] = a
        assert env.to_dict_action(action)["lr"] == pytest.approx(lr)
    env = ElasticClusterEnv(max_decisions=4)
    env.reset(seed=0)
    _, _, _, _, info = env.step({**KEEP, "batch": np.full(env.num_workers, 2)})
    assert info["lr_multiplier"] == 1.0  # the dict form's lr in its own units: not a normalised 1.25


def test_same_seed_same_rollout():
    def rollout(seed):
        env = ElasticClusterEnv(action_form="multidiscrete", max_decisions=15)
        env.action_space.seed(3)
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for _ in range(15):
            obs, r, term, trunc, info = env.step(env.action_space.sample())
            out += [obs, np.array([r, info["spend_usd"]])]
            if term or trunc:
                break
        return np.concatenate(out)

    assert np.array_equal(rollout(7), rollout(7))
    assert not np.array_equal(rollout(7), rollout(8))


def test_every_reward_term_is_reported_for_both_rewards():
    for kind, names in (
        ("cost", {"dollars", "time_value", "target_bonus"}),
        ("scheduler", {"throughput", "cost", "progress", "smoothing"}),
    ):
        env = ElasticClusterEnv(reward=kind, batch_action="none")
        env.reset(seed=0)
        _, r, *_, info = env.step({**KEEP, "workers": np.array([2, 3, 2, 2])})
        assert set(info["reward_terms"]) == names
        assert r == pytest.approx(sum(info["reward_terms"].values()))
        if kind == "scheduler":
            assert info["reward_terms"]["smoothing"] == pytest.approx(-0.1 * (0.5**2) / 5)


def test_requests_beyond_the_pool_and_below_one_gpu_are_denied_and_listed():
    env = ElasticClusterEnv(batch_action="none", initial_allocation={"T4/spot": 4})
    env.reset(seed=0)
    _, _, _, _, info = env.step({**KEEP, "workers": np.array([2, 4, 2, 2])})  # +2 T4 spot, none free
    assert info["denied"] == [{"offer": "T4/spot", "requested": 2, "granted": 0}]
    env = ElasticClusterEnv(batch_action="none", initial_allocation={"T4/spot": 1})
    env.reset(seed=0)
    _, _, _, _, info = env.step({**KEEP, "workers": np.array([2, 0, 2, 2])})  # release 2 of 1
    assert info["denied"] == [{"offer": "T4/spot", "requested": -2, "granted": 0}]
    assert info["held_counts"]["T4/spot"] == 1
    with pytest.raises(ValueError, match=r"action\['lr'\]"):
        env.step({**KEEP, "lr": np.array([2.0])})


def test_a_change_costs_a_restart_and_a_preemption_comes_after_its_notice():
    pool = spec_to_dict(get_pool("t4v100_spot"))
    pool["preemption"] = {"rate_per_hour": 60.0, "notice_s": 30.0, "unavailable_s": [600.0, 600.0]}
    env = ElasticClusterEnv(
        pool=pool, batch_action="none", initial_allocation={"T4/spot": 4, "T4/on_demand": 1}
    )
    _, info = env.reset(seed=1)
    t0 = info["wall_time_s"]
    _, _, _, _, info = env.step({**KEEP, "workers": np.array([3, 2, 2, 2])})
    assert info["report"].truth["stall_s"] >= 30.0 and info["restarts"] >= 1
    events = []
    for _ in range(40):
        _, _, term, trunc, info = env.step(KEEP)
        events += info["pool_events"]
        if term or trunc:
            break
    notices = [e for e in events if " notice " in e]
    preempts = [e for e in events if " preempt " in e]
    assert notices and preempts
    first = preempts[0]
    slot = first.split(" slot ")[1].split(" ")[0]
    t_notice = next(float(e.split("s ")[0][2:]) for e in notices if f" slot {slot} " in e)
    assert float(first.split("s ")[0][2:]) == pytest.approx(t_notice + 30.0)
    assert t0 > 0


def test_the_engine_is_unchanged_while_every_worker_is_held():
    def reports(call):
        sim = Simulator("t4v100", "cifar10", "mixed", seed=3)
        sim.reset(seed=3)
        if call:
            assert sim.set_workers(np.ones(8, dtype=bool), 30.0) is False  # no change, no restart
        return [sim.run_interval(np.full(8, 128), 50) for _ in range(30)]

    for a, b in zip(reports(False), reports(True), strict=True):
        assert a == b


def test_an_episode_reports_time_and_dollars_to_accuracy():
    env = ElasticClusterEnv(batch_action="none", initial_allocation={"T4/on_demand": 4}, interval=100)
    env.reset(seed=0)
    while True:
        _, _, term, trunc, info = env.step(KEEP)
        if term or trunc:
            break
    assert term
    assert info["dollars_to_accuracy"] == pytest.approx(4 * 0.35 * info["time_to_accuracy_s"] / 3600.0)


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(100, 10_000),
    actions=st.lists(st.lists(st.integers(0, 4), min_size=5, max_size=5), min_size=1, max_size=8),
)
def test_any_action_sequence_keeps_the_pool_invariants(seed, actions):
    """Whatever is asked: at least one GPU, never more than the pool has, spend never falls and
    grows at most at the held GPUs' price, and every shortfall is listed."""
    env = ElasticClusterEnv(action_form="multidiscrete", batch_action="none", max_decisions=12)
    env.reset(seed=seed)
    cap = env.job.capacity
    spend, t = 0.0, 0.0
    for a in actions:
        _, _, term, trunc, info = env.step(np.array(a))
        held = np.array(list(info["held_counts"].values()))
        assert held.sum() >= 1 and np.all(held <= cap)
        assert info["spend_usd"] >= spend
        max_rate = float(env.job.slot_price.sum())
        assert info["spend_usd"] - spend <= max_rate * (info["wall_time_s"] - t) / 3600.0 + 1e-9
        spend, t = info["spend_usd"], info["wall_time_s"]
        for d in info["denied"]:
            assert abs(d["granted"]) < abs(d["requested"])
        if term or trunc:
            break
