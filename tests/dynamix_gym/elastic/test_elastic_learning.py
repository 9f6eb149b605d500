"""Elastic baselines and learners: what each baseline holds, bad input, and a tiny PPO / SAC / TD3 run
through the training entry point to a bundle that loads and drives the env."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dynamix_gym.controllers.bundle import BundleMismatchError
from dynamix_gym.elastic.baselines import ElasticSpec, FixedAllocation, make_elastic_controller
from dynamix_gym.elastic.evaluation import run_elastic_episode
from dynamix_gym.elastic.hindsight import hindsight_fixed_allocation
from dynamix_gym.elastic.pools import get_pool
from dynamix_gym.elastic.training import ElasticTrainConfig, load_elastic_bundle, train_elastic
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from sim.specs_io import spec_to_dict

ENV = {"batch_action": "none", "interval": 100}


def _volatile_pool() -> dict:
    pool = spec_to_dict(get_pool("t4v100_spot"))
    pool["preemption"] = {"rate_per_hour": 20.0, "notice_s": 30.0, "unavailable_s": [200.0, 200.0]}
    return pool


def test_a_fixed_allocation_holds_its_gpus_and_takes_back_returned_capacity():
    counts = {"T4/spot": 4}
    env = ElasticClusterEnv(pool=_volatile_pool(), initial_allocation=counts, **ENV)
    r = run_elastic_episode(env, FixedAllocation(counts), seed=100)
    assert r["reached_target"] and r["preemptions"] >= 1
    held = [h["held_T4/spot"] for h in r["history"]]
    assert min(held) < 4  # lost to preemptions ...
    first_loss = next(i for i, h in enumerate(held) if h < 4)
    assert any(
        b > a for a, b in zip(held[first_loss:], held[first_loss + 1 :], strict=False)
    )  # ... and taken back
    assert all(h["held_T4/spot"] + h["held_T4/on_demand"] <= 4 for h in r["history"])


def test_the_rule_the_oracle_and_the_backfill_leave_the_expensive_start_and_reach_the_target():
    for name, params in (
        ("goodput_per_dollar", {"threshold": 20.0, "cooldown": 5}),
        ("oracle_pool", {}),
        ("spot_backfill", {}),
    ):
        env = ElasticClusterEnv(**ENV)  # starts on 2 T4 + 2 V100 on demand ($5.66/h)
        r = run_elastic_episode(env, make_elastic_controller(name, **params), seed=100)
        assert r["reached_target"], name
        assert r["history"][-1]["held_V100/on_demand"] < 2, name
        assert r["dollars_to_accuracy"] < 5.66 * r["time_to_accuracy_s"] / 3600.0, name


def test_the_backfill_replaces_a_preempted_spot_gpu_on_demand():
    env = ElasticClusterEnv(pool=_volatile_pool(), initial_allocation={"T4/spot": 4}, **ENV)
    r = run_elastic_episode(env, make_elastic_controller("spot_backfill"), seed=100)
    assert any(h["held_T4/on_demand"] > 0 for h in r["history"])
    assert all(h["held_T4/spot"] + h["held_T4/on_demand"] <= 4 for h in r["history"])


def test_the_backfill_swaps_a_noticed_spot_gpu_in_one_change_and_keeps_its_replacement():
    """swap_on_notice: the noticed spot GPU is released and its on-demand replacement requested in
    the same change, before the loss; hand_back=False: the replacement stays when capacity returns."""
    env = ElasticClusterEnv(pool=_volatile_pool(), initial_allocation={"T4/spot": 4}, **ENV)
    ctl = make_elastic_controller("spot_backfill", swap_on_notice=True, hand_back=False)
    r = run_elastic_episode(env, ctl, seed=100)
    assert r["reached_target"]
    log = env.job.log
    noticed = {e.slot for e in log if e.kind == "notice"}
    swaps = [
        e
        for e in log
        if e.kind == "release" and e.offer == "T4/spot" and e.slot in noticed
        and any(q.kind == "request" and q.offer == "T4/on_demand" and q.time_s == e.time_s for q in log)
    ]  # fmt: skip
    assert swaps
    od = [h["held_T4/on_demand"] for h in r["history"]]
    assert max(od) >= 1 and all(b >= a for a, b in itertools.pairwise(od))  # never handed back
    assert all(h["held_T4/spot"] + h["held_T4/on_demand"] <= 4 for h in r["history"])
    plain = make_elastic_controller("spot_backfill")  # waits for the loss, hands back
    r0 = run_elastic_episode(
        ElasticClusterEnv(pool=_volatile_pool(), initial_allocation={"T4/spot": 4}, **ENV), plain, seed=100
    )
    assert r0["preemptions"] >= 1


def test_a_baseline_runs_at_its_learning_rate_multiplier_and_a_higher_one_trains_faster_here():
    """The fitted response rises with the multiplier on the measured task (sim/data/lr_response.json)."""
    counts = {"T4/on_demand": 4}
    times = {}
    for lr in (1.0, 1.25):
        env = ElasticClusterEnv(initial_allocation=counts, **ENV)
        r = run_elastic_episode(
            env, make_elastic_controller("fixed", counts=counts, lr_multiplier=lr), seed=100
        )
        assert env.job.lr_multiplier == lr and r["reached_target"]
        times[lr] = r["time_to_accuracy_s"]
    assert times[1.25] < times[1.0]


def test_baseline_bad_input_names_the_field():
    env = ElasticClusterEnv(**ENV)
    spec = ElasticSpec.from_env(env)
    with pytest.raises(ValueError, match=r"counts\['T4/spot'\] = 9 is beyond the pool: allowed \[0, 4\]"):
        FixedAllocation({"T4/spot": 9}).reset(spec)
    with pytest.raises(ValueError, match="offer 'P100/spot'"):
        FixedAllocation({"P100/spot": 1}).reset(spec)
    with pytest.raises(ValueError, match="at least one"):
        FixedAllocation({"T4/spot": 0})
    with pytest.raises(ValueError, match=r"goodput_per_dollar\.threshold"):
        make_elastic_controller("goodput_per_dollar", threshold=-1.0)
    with pytest.raises(ValueError, match="not one of"):
        make_elastic_controller("magic")
    with pytest.raises(ValueError, match=r"fixed\.lr_multiplier must be in \[0\.8, 1\.25\]"):
        make_elastic_controller("fixed", counts={"T4/spot": 1}, lr_multiplier=2.0)
    with pytest.raises(ValueError, match=r"spot_backfill\.on_demand"):
        make_elastic_controller("spot_backfill", gpus=4, on_demand=5)
    with pytest.raises(ValueError, match=r"spot_backfill\.swap_on_notice must be true or false"):
        make_elastic_controller("spot_backfill", swap_on_notice="yes")
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="elastic_truth"):
        oracle = make_elastic_controller("oracle_pool")
        oracle.reset(spec)
        oracle.predict(None, {"held": env.job.held})


def test_seeds_below_100_are_refused_for_training():
    with pytest.raises(ValueError, match=">= 100"):
        ElasticTrainConfig(run_dir="x", eval_seeds=(0,))


def test_exploration_noise_is_refused_for_ppo_and_outside_its_range():
    with pytest.raises(ValueError, match="off-policy"):
        ElasticTrainConfig(run_dir="x", algo="ppo", action_noise_sigma=0.1)
    with pytest.raises(ValueError, match=r"action_noise_sigma must lie in \(0, 1\]"):
        ElasticTrainConfig(run_dir="x", algo="td3", action_noise_sigma=0.0)
    with pytest.raises(ValueError, match=r"select_time_value_usd_per_hour must lie in \[0, 1e6\)"):
        ElasticTrainConfig(run_dir="x", select_time_value_usd_per_hour=-1.0)


@pytest.mark.parametrize(
    ("algo", "kwargs"),
    [
        ("ppo", {"n_steps": 64, "batch_size": 64, "n_epochs": 1}),
        ("sac", {"learning_starts": 32, "batch_size": 32}),
        ("td3", {"learning_starts": 32, "batch_size": 32}),
    ],
)
def test_a_tiny_run_writes_a_bundle_that_loads_and_refuses_other_spaces(tmp_path, algo, kwargs):
    cfg = ElasticTrainConfig(
        run_dir=str(tmp_path),
        algo=algo,
        total_timesteps=128,
        n_envs=2 if algo == "ppo" else 1,
        eval_every=128,
        eval_seeds=(100,),
        env={**ENV, "max_decisions": 12, "reward": {"kind": "cost", "time_value_usd_per_hour": 1.0}},
        algo_kwargs=kwargs,
        policy_kwargs={"net_arch": [16]},
        expert_pretrain={"expert": "fixed", "params": {"counts": {"T4/spot": 4}}, "episodes": 1, "epochs": 2},
        action_noise_sigma=None if algo == "ppo" else 0.1,
    )
    result = train_elastic(cfg)
    assert result["warm_start"]["samples"] > 0 and len(result["history"]) == 2
    form = "multidiscrete" if algo == "ppo" else "box"
    env = ElasticClusterEnv(**{**ENV, "max_decisions": 12}, action_form=form)
    policy = load_elastic_bundle(tmp_path / "best", env)
    assert policy.meta["metadata"]["algo"] == algo
    r = run_elastic_episode(env, policy, seed=100)
    assert r["decisions"] >= 1
    other = ElasticClusterEnv(
        **{**ENV, "max_decisions": 12}, action_form="box" if algo == "ppo" else "multidiscrete"
    )
    with pytest.raises(BundleMismatchError, match="action space"):
        load_elastic_bundle(tmp_path / "best", other)
    assert np.isfinite(r["spend_usd"])


def test_the_hindsight_allocation_is_no_dearer_than_any_fixed_allocation_of_its_grid():
    pool = spec_to_dict(get_pool("t4v100_spot"))
    pool["node_types"] = pool["node_types"][:1]  # T4 only: offers T4/on_demand, T4/spot
    pool["initial"] = [["T4/on_demand", 1]]
    kw = {**ENV, "pool": pool}
    best = hindsight_fixed_allocation(kw, 100, [0, 4])
    assert best is not None
    for alloc in ({"T4/spot": 4}, {"T4/on_demand": 4}):
        r = run_elastic_episode(
            ElasticClusterEnv(**kw, initial_allocation=alloc), FixedAllocation(alloc), 100
        )
        assert best["dollars_to_accuracy"] <= r["dollars_to_accuracy"] + 1e-12
    limited = hindsight_fixed_allocation(kw, 100, [0, 4], time_limit_s=0.9 * best["time_to_accuracy_s"])
    assert limited is None or limited["time_to_accuracy_s"] <= 0.9 * best["time_to_accuracy_s"]
    with pytest.raises(ValueError, match=r"hindsight counts\[1\]"):
        hindsight_fixed_allocation(kw, 100, [0, -1])


def test_the_switch_once_hindsight_starts_on_the_pool_and_pays_the_move():
    pool = spec_to_dict(get_pool("t4v100_spot"))
    pool["node_types"] = pool["node_types"][:1]
    pool["initial"] = [["T4/on_demand", 1]]  # not in the grid [0, 4]: every schedule moves once
    kw = {**ENV, "pool": pool}
    switch = hindsight_fixed_allocation(kw, 100, [0, 4], from_initial=True)
    assert switch is not None and switch["restarts"] >= 1
    alloc = switch["allocation"]
    held = run_elastic_episode(ElasticClusterEnv(**kw, initial_allocation=alloc), FixedAllocation(alloc), 100)
    assert switch["time_to_accuracy_s"] > held["time_to_accuracy_s"]  # the first interval and the restart
    assert switch["history"][0]["held_T4/on_demand"] == 1
