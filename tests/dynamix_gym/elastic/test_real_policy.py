"""The elastic env over real ranks: a pool of a calibrated profile's worker type, simulated and real
through the same ElasticClusterEnv; the real backend refuses pools it cannot run, re-forms its group
when the policy changes the worker count, bills what it holds and passes the lr multiplier on."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from support import ranks_alive

from adapters.elastic_job import RealElasticBackend, SpotPreemptions
from dynamix_gym.elastic.pools import get_pool
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from sim.cluster import ProfiledNodeSpec
from sim.pool import pool_from_dict
from sim.specs_io import spec_to_dict


def _cpu_pool(**over):
    data = spec_to_dict(get_pool("cpu_local"))
    data.update(over)
    return data


def test_a_pool_may_name_a_profiles_worker_type_and_its_measured_restart():
    pool = get_pool("cpu_local")
    assert pool.offers == ("cpu/on_demand", "cpu/spot") and pool.num_slots == 2
    (node,) = pool.slot_cluster().nodes
    assert isinstance(node, ProfiledNodeSpec) and node.gpu == "cpu" and node.gpus == 2
    measured = json.load(open("results/elastic/real_restart.json"))["median_restart_s"]
    assert pool.restart_s == pytest.approx(measured)
    per_node = pool_from_dict(_cpu_pool(node_types=[{**spec_to_dict(pool)["node_types"][0], "per_node": 1}]))
    assert [n.gpus for n in per_node.slot_cluster().nodes] == [1, 1]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"profile": ""}, r"node_types\[0\]\.gpu \(node type\) 'cpu'"),
        ({"profile": "no/such/profile"}, "pool.profile"),
        ({"restart_measured": "results/elastic/real_restart.json"}, "restart_s or restart_measured"),
    ],
)
def test_bad_profile_pools_name_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        pool_from_dict(_cpu_pool(**change))


def test_a_restart_file_without_a_positive_median_names_the_field(tmp_path):
    bad = tmp_path / "restart.json"
    bad.write_text(json.dumps({"median_restart_s": -1}))
    data = _cpu_pool()
    data.pop("restart_s")
    with pytest.raises(ValueError, match="median_restart_s"):
        pool_from_dict({**data, "restart_measured": str(bad)})
    with pytest.raises(ValueError, match="restart_measured: no file"):
        pool_from_dict({**data, "restart_measured": str(tmp_path / "none.json")})


def test_the_simulated_cpu_pool_trains_the_profiles_workload():
    env = ElasticClusterEnv(pool="cpu_local", interval=20, batch_action="none")
    _, info = env.reset(seed=0)
    assert env.backend.spec.gpu_types == ("cpu", "cpu") and env.backend.spec.target_accuracy == 0.9
    assert info["held_counts"] == {"cpu/on_demand": 1, "cpu/spot": 0}
    _, _, _, _, info = env.step({"workers": np.array([3, 2]), "lr": np.array([1.0])})
    assert info["held_counts"]["cpu/on_demand"] == 2 and info["restarts"] == 1
    assert info["wall_time_s"] > env.pool.restart_s
    assert "elastic_truth" in info


def test_the_real_backend_refuses_a_pool_of_two_worker_types():
    two = [
        {
            "gpu": "cpu",
            "on_demand": 1,
            "spot": 0,
            "on_demand_usd_per_gpu_hour": 0.05,
            "spot_usd_per_gpu_hour": 0.01,
        },
        {
            "gpu": "T4",
            "on_demand": 1,
            "spot": 0,
            "on_demand_usd_per_gpu_hour": 0.35,
            "spot_usd_per_gpu_hour": 0.11,
        },
    ]
    with pytest.raises(ValueError, match=r"pool\.node_types: real ranks of one machine are one worker type"):
        RealElasticBackend(pool_from_dict(_cpu_pool(node_types=two)))
    assert not ranks_alive()


def _spot_pool(rate=3600.0, notice=0.5, away=(2.0, 2.0), **over):
    node = {
        "gpu": "cpu",
        "on_demand": 1,
        "spot": 1,
        "on_demand_usd_per_gpu_hour": 0.0475,
        "spot_usd_per_gpu_hour": 0.01,
    }
    preemption = {"rate_per_hour": rate, "notice_s": notice, "unavailable_s": list(away)}
    return pool_from_dict(_cpu_pool(node_types=[node], preemption=preemption, **over))


def test_emulated_preemptions_follow_the_simulated_rules():
    pool = _spot_pool()
    (spot,) = np.flatnonzero(pool.slot_is_spot)
    clock = SpotPreemptions(pool, np.random.default_rng(0))
    events = clock.advance(36000.0, lambda s: True)
    assert {s for _, _, s in events} == {spot} and [t for t, _, _ in events] == sorted(
        t for t, _, _ in events
    )
    kinds = [k for _, k, _ in events]
    assert kinds[:3] == ["notice", "loss", "available"] and kinds[3:6] == kinds[:3]
    notices = [t for t, k, _ in events if k == "notice"]
    losses = [t for t, k, _ in events if k == "loss"]
    assert np.allclose(np.array(losses) - np.array(notices[: len(losses)]), 0.5)
    # one cycle: a mean wait of 1 s (3600 per hour), the 0.5 s notice, 2 s away
    assert len(notices) == pytest.approx(36000 / 3.5, rel=0.05)
    never = SpotPreemptions(pool, np.random.default_rng(0))
    assert never.advance(36000.0, lambda s: False) == []  # a slot the job does not hold is not preempted
    assert SpotPreemptions(_spot_pool(rate=0.0), np.random.default_rng(0)).advance(1e6, lambda s: True) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_env_drives_real_ranks_through_a_policys_worker_count_change():
    backend = RealElasticBackend("cpu_local", time_budget_s=60)
    env = ElasticClusterEnv(backend=backend, interval=20, batch_action="none")
    obs, info = env.reset(seed=0)
    sim_env = ElasticClusterEnv(pool="cpu_local", interval=20, batch_action="none")
    sim_obs, _ = sim_env.reset(seed=0)
    assert env.observation_space == sim_env.observation_space and env.action_space == sim_env.action_space
    assert obs.shape == sim_obs.shape and "elastic_truth" not in info
    grow = {"workers": np.array([3, 2]), "lr": np.array([1.25])}
    keep = {"workers": np.array([2, 2]), "lr": np.array([1.25])}
    spend0 = info["spend_usd"]
    _, _, terminated, truncated, info = env.step(grow)
    assert info["held_counts"]["cpu/on_demand"] == 2 and info["restarts"] == 1
    assert info["report"].alive.tolist() == [True, True] and info["report"].local_batch.shape == (2,)
    assert any("request slot 1" in e for e in info["pool_events"])
    assert any("elastic restart 1 -> 2" in e for e in info["report"].events)
    (restart,) = env.job.restart_times_s
    assert 0 < restart < info["wall_time_s"]
    assert env.job.backend.inner.lr_multiplier == 1.25  # carried over the restart to the new ranks
    assert info["spend_usd"] > spend0 and info["cost_rate_usd_per_hour"] == pytest.approx(2 * 0.0475)
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(keep)
    assert terminated and math.isfinite(info["time_to_accuracy_s"]) and info["dollars_to_accuracy"] > 0
    with pytest.raises(ValueError, match=r"deltas\[0\] \(cpu/on_demand\) requests 1 GPUs, beyond the pool"):
        env.job.change(np.array([1, 0]))
    env.close()
    sim_env.close()
    assert not ranks_alive()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_spot_rank_is_preempted_after_its_notice_and_the_group_re_forms_without_it():
    pool = _spot_pool(rate=3600.0, notice=0.2, away=(30.0, 30.0), initial={"cpu/on_demand": 1, "cpu/spot": 1})
    env = ElasticClusterEnv(
        backend=RealElasticBackend(pool, time_budget_s=60, target_accuracy=0.97),
        interval=20,
        batch_action="none",
    )
    _, info = env.reset(seed=0)
    keep = {"workers": np.array([2, 2]), "lr": np.array([1.0])}
    events, held_spot, done = [], [], False
    while not done:
        _, _, terminated, truncated, info = env.step(keep)
        events += info["pool_events"]
        held_spot.append(info["held_counts"]["cpu/spot"])
        done = terminated or truncated
    assert any(" notice " in e for e in events) and any(" preempt " in e for e in events), events
    assert 0 in held_spot and info["restarts"] >= 1 and len(env.job.restart_times_s) == info["restarts"]
    assert info["free_counts"]["cpu/spot"] == 0  # away for 30 s: not back within the run
    env.close()
    assert not ranks_alive()
