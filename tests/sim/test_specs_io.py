"""Config dicts <-> simulator specs: exact round trips, strict keys, actionable errors."""

from __future__ import annotations

import math

import pytest
import yaml

from sim.cluster import CLUSTERS, ClusterSpec, NodeSpec, ProfiledNodeSpec, default_cluster
from sim.faults import SCENARIOS, FaultWindow, Scenario, ThrottleSpec
from sim.specs_io import (
    cluster_from_dict,
    cluster_to_dict,
    scenario_from_dict,
    scenario_to_dict,
    workload_from_dict,
    workload_to_dict,
)
from sim.workloads import WORKLOADS

CUSTOM = Scenario(
    name="custom",
    description="windows, per-worker speeds and a bounded slowdown",
    throttle=ThrottleSpec(gpu_types=("T4", "V100"), rate_per_hour=1.5),
    windows=(FaultWindow("throttle", 60.0, 30.0, worker=2, factor=0.5), FaultWindow("loss", 10.0, math.inf)),
    worker_speed=(1.0, 0.5, 1.0, 1.0),
)


@pytest.mark.parametrize("scenario", [*SCENARIOS.values(), CUSTOM], ids=lambda s: s.name)
def test_scenario_round_trip_is_exact_also_through_yaml_text(scenario):
    d = scenario_to_dict(scenario)
    assert scenario_from_dict(d) == scenario
    # Through YAML text (pairs as lists, inf as .inf) and back.
    assert scenario_from_dict(yaml.safe_load(yaml.safe_dump(d))) == scenario
    assert isinstance(scenario_from_dict(d).throttle.duration_s, tuple)


def test_scenario_dict_holds_every_field_as_plain_data():
    d = scenario_to_dict(SCENARIOS["mixed"])
    assert set(d) == {f for f in Scenario.__dataclass_fields__}
    assert d["slowdown"]["duration_s"] == [math.inf, math.inf]
    assert d["network"]["congestion_bandwidth_factor"] == [0.1, 0.4]
    windows = scenario_to_dict(CUSTOM)["windows"]
    assert windows[0] == {"kind": "throttle", "start_s": 60.0, "duration_s": 30.0, "worker": 2, "factor": 0.5}


def test_integers_in_float_fields_become_floats_and_lists_tuples():
    s = scenario_from_dict({"name": "x", "throttle": {"rate_per_hour": 3, "duration_s": [60, 120]}})
    assert s.throttle.rate_per_hour == 3.0 and isinstance(s.throttle.rate_per_hour, float)
    assert s.throttle.duration_s == (60.0, 120.0)
    assert s == Scenario("x", throttle=ThrottleSpec(rate_per_hour=3.0, duration_s=(60.0, 120.0)))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_round_trip_is_exact(name):
    assert workload_from_dict(workload_to_dict(WORKLOADS[name])) == WORKLOADS[name]


def test_profiled_cluster_round_trip_keeps_memory_out_of_the_nodes():
    spec = ClusterSpec(
        "p", (ProfiledNodeSpec(gpu="cpu", gpus=2, cpu_cores=4, mem_gib=8.0), NodeSpec("T4", 4))
    )
    d = cluster_to_dict(spec)
    assert d == {
        "name": "p",
        "nodes": [
            {"gpu": "cpu", "gpus": 2, "cpu_cores": 4, "host_mem_gib": 128.0},
            {"gpu": "T4", "gpus": 4, "cpu_cores": 16, "host_mem_gib": 128.0},
        ],
    }
    assert cluster_from_dict(d, {"cpu": 8.0}, "profile.json") == spec
    with pytest.raises(ValueError, match="give its memory in gpu_memory_gib"):
        cluster_from_dict(d, {}, "profile.json")
    with pytest.raises(ValueError, match=r"profile.json: cluster.nodes\[0\]: unknown key"):
        cluster_from_dict(
            {"name": "p", "nodes": [{"gpu": "cpu", "mem_gib": 2}]}, {"cpu": 8.0}, "profile.json"
        )


@pytest.mark.parametrize("name", list(CLUSTERS))
def test_cluster_round_trip_is_exact(name):
    spec = CLUSTERS[name]()
    d = cluster_to_dict(spec)
    assert cluster_from_dict(d) == spec
    assert d["nodes"][0] == {  # every field, as plain data
        "gpu": spec.nodes[0].gpu,
        "gpus": spec.nodes[0].gpus,
        "cpu_cores": spec.nodes[0].cpu_cores,
        "host_mem_gib": spec.nodes[0].host_mem_gib,
    }


def test_cluster_default_mix_form():
    assert cluster_from_dict({"workers": 8}) == CLUSTERS["t4v100"]()
    assert cluster_from_dict({"workers": 16, "t4_fraction": 0.5}) == CLUSTERS["t4v100_16"]()
    spec = cluster_from_dict({"workers": 4, "t4_fraction": 0.25, "name": "mine"})
    assert spec.name == "mine" and spec.gpu_types == ("T4", "V100", "V100", "V100")
    assert spec == ClusterSpec("mine", (NodeSpec("T4", 1), NodeSpec("V100", 3)))
    assert cluster_from_dict({"workers": 6}) == default_cluster(6)


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        (
            {"name": "x", "throttel": {}},
            ["scenario: unknown key 'throttel'", "known keys: name, description, throttle, interference"],
        ),
        (
            {"name": "x", "throttle": {"rate_per_hr": 1.0}},
            ["scenario.throttle: unknown key 'rate_per_hr'", "rate_per_hour, duration_s, speed_factor"],
        ),
        (
            {"name": "x", "windows": [{"kind": "loss", "start_s": 1, "duration_s": 2, "wroker": 1}]},
            [
                "scenario.windows[0]: unknown key 'wroker'",
                "known keys: kind, start_s, duration_s, worker, factor",
            ],
        ),
        ({"description": "no name"}, ["scenario: missing required key ['name']"]),
        ({"name": "x", "network": [0.3]}, ["scenario.network must be a mapping of NetworkSpec fields"]),
        (
            {"name": "x", "slowdown": {"factor": [0.1, 0.2, 0.3]}},
            ["scenario.slowdown.factor must be a list of 2"],
        ),
        ({"name": "x", "compute_noise_cv": "high"}, ["scenario.compute_noise_cv must be a number"]),
        # Values are checked by the specs' own validators, which name the field and its range.
        ({"name": "x", "throttle": {"rate_per_hour": -1.0}}, ["throttle.rate_per_hour"]),
    ],
)
def test_bad_scenarios_fail_with_a_message_naming_the_key(data, needles):
    with pytest.raises(ValueError) as err:
        scenario_from_dict(data)
    for needle in needles:
        assert needle in str(err.value)


def test_bad_workloads_and_clusters_fail_clearly():
    d = workload_to_dict(WORKLOADS["cifar10"]) | {"target_acc": 0.9}
    with pytest.raises(ValueError, match=r"workload: unknown key 'target_acc'; known keys: name, model"):
        workload_from_dict(d)
    with pytest.raises(
        ValueError, match=r"cluster \(default-mix form\): unknown key 'gpus'; known keys: name, workers"
    ):
        cluster_from_dict({"workers": 8, "gpus": 4})
    with pytest.raises(ValueError, match=r"cluster.nodes\[1\]: unknown key 'gpu_count'"):
        cluster_from_dict({"name": "c", "nodes": [{"gpu": "T4", "gpus": 4}, {"gpu": "T4", "gpu_count": 4}]})
    with pytest.raises(ValueError, match=r"either `nodes`.*or `workers`"):
        cluster_from_dict({"workers": 8, "nodes": []})
    with pytest.raises(ValueError, match="cluster needs `nodes`"):
        cluster_from_dict({"name": "empty"})
    with pytest.raises(ValueError, match="node gpu type"):
        cluster_from_dict({"name": "c", "nodes": [{"gpu": "H100", "gpus": 8}]})
