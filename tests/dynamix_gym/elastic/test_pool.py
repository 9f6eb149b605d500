"""Pools from config: prices with a source and date, and bad input naming its field."""

from __future__ import annotations

import numpy as np
import pytest

from dynamix_gym.elastic.pools import get_pool, pool_names
from sim.elastic import ElasticJob
from sim.pool import pool_from_dict
from sim.specs_io import spec_to_dict


def _pool(**over):
    data = spec_to_dict(get_pool("t4v100_spot"))
    data.update(over)
    return data


def test_the_shipped_pool_records_its_prices_source_and_date():
    assert "t4v100_spot" in pool_names()
    pool = get_pool("t4v100_spot")
    assert "cloud.google.com" in pool.price_source and pool.price_date.startswith("20")
    assert pool.offers == ("T4/on_demand", "T4/spot", "V100/on_demand", "V100/spot")
    assert pool.price("V100/on_demand") > pool.price("V100/spot") > 0
    assert pool.num_slots == 16 and pool.slot_cluster().num_workers == 16
    assert pool_from_dict(spec_to_dict(pool)) == pool


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {
                "node_types": [
                    {
                        "gpu": "K9000",
                        "on_demand": 1,
                        "spot": 0,
                        "on_demand_usd_per_gpu_hour": 1.0,
                        "spot_usd_per_gpu_hour": 0.5,
                    }
                ]
            },
            "pool.node_types[0].gpu",
        ),
        (
            {
                "node_types": [
                    {
                        "gpu": "T4",
                        "on_demand": 1,
                        "spot": 1,
                        "on_demand_usd_per_gpu_hour": 0.35,
                        "spot_usd_per_gpu_hour": -0.1,
                    }
                ]
            },
            "pool.node_types[0].spot_usd_per_gpu_hour",
        ),
        (
            {
                "node_types": [
                    {
                        "gpu": "T4",
                        "on_demand": -1,
                        "spot": 1,
                        "on_demand_usd_per_gpu_hour": 0.35,
                        "spot_usd_per_gpu_hour": 0.1,
                    }
                ]
            },
            "pool.node_types[0].on_demand",
        ),
        ({"initial": {"T4/spot": 9}}, "pool.initial[0] (T4/spot)"),
        ({"initial": {"T4/spot": 0}}, "pool.initial must hold at least one GPU"),
        ({"initial": {"A100/spot": 1}}, "pool.initial[0] offer"),
        ({"price_source": ""}, "pool.price_source"),
        ({"restart_s": -1.0}, "pool.restart_s"),
        ({"colour": "red"}, "'colour'"),
    ],
)
def test_bad_pool_input_names_the_field(change, field):
    with pytest.raises(
        ValueError,
        match=field.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)"),
    ):
        pool_from_dict(_pool(**change))


def test_an_unknown_pool_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="t4v100_spot"):
        get_pool("no_such_pool")


def test_the_job_api_refuses_requests_beyond_the_pool_and_fewer_than_one_worker():
    job = ElasticJob(get_pool("t4v100_spot"), "cifar10")
    job.reset(seed=0)
    with pytest.raises(ValueError, match=r"deltas\[1\] \(T4/spot\) requests 5 GPUs, beyond the pool: 4 free"):
        job.change([0, 5, 0, 0])
    with pytest.raises(ValueError, match=r"deltas\[0\] \(T4/on_demand\) releases 3 GPUs, the job holds 2"):
        job.change([-3, 0, 0, 0])
    with pytest.raises(ValueError, match="at least one"):
        job.change([-2, 0, -2, 0])
    with pytest.raises(ValueError, match="lr_multiplier"):
        job.set_lr_multiplier(1.5)
    assert job.held_counts().tolist() == [2, 0, 2, 0]  # nothing changed


def test_spend_is_price_times_time_held():
    job = ElasticJob(get_pool("t4v100_spot"), "cifar10")
    job.reset(seed=0)
    b = np.full(job.num_slots, 128)
    job.run_interval(b, 20)
    t1 = job.sim.now_s
    assert job.spend_usd() == pytest.approx((2 * 0.35 + 2 * 2.48) * t1 / 3600.0)
    job.change([0, 0, -2, 0])  # release both V100s: their bill stops now
    job.run_interval(b, 20)
    t2 = job.sim.now_s
    assert job.spend_usd() == pytest.approx((2 * 0.35 * t2 + 2 * 2.48 * t1) / 3600.0)
    assert job.restarts == 1
