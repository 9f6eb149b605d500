"""Baselines whose parameters follow the workload (issue 11.2): no default is a CIFAR-10 batch size.

The NCF comparisons run on ten seeds (100-109; TUNING.md's tuning seeds are 100-104): a run's
first decisions follow a noise-scale estimate from one interval, and on two seeds (100-101, this
test's until 2026-12-02) the mean swung with the machine: Pollux within 1.4x the best static batch
on the CPUs it ran on before, 2.8x on an AMD EPYC, where seed 101's run differs; over ten seeds the
ratios are 1.5-1.9x for the rules and 4.6x for REX. The bounds are the gaps TUNING.md explains.
"""

from __future__ import annotations

import numpy as np
import pytest

from dynamix_gym import HeteroClusterEnv
from dynamix_gym.controllers import make_controller
from dynamix_gym.evaluation import run_episode

NCF_SEEDS = tuple(range(100, 110))


def make_env(workload: str, scenario: str = "mixed", initial_batch: int | None = None) -> HeteroClusterEnv:
    return HeteroClusterEnv(
        workers=8,
        workload=workload,
        scenario=scenario,
        action_mode="absolute",
        interval=50,
        initial_batch=initial_batch,
    )


def mean_tta(name: str, **params) -> float:
    env = make_env("ncf", initial_batch=params.get("batch") if name == "static" else None)
    times = []
    for seed in NCF_SEEDS:
        summary = run_episode(env, make_controller(name, **params), seed, scenario="mixed").summary
        assert summary["reached_target"], (name, params, seed)
        times.append(summary["time_to_accuracy_s"] / 60.0)
    env.close()
    return float(np.mean(times))


@pytest.fixture(scope="module")
def ncf_static() -> dict[int, float]:
    # The memory cap (32768) is NCF's best static local batch; 256 is its initial batch.
    return {b: mean_tta("static", batch=b) for b in (256, 32768)}


@pytest.mark.parametrize(
    ("name", "max_ratio"),
    # Pollux as the other rules: it re-optimises once per epoch (AdaptDL's cadence), and when the
    # first interval's noise estimate is low its first batch (~800 of NCF's 32768) holds for the
    # epoch, most of an NCF run (1.79x over these seeds, 1.86x over seeds 100-129)
    [("dlb", 2.0), ("omnilearn", 2.0), ("pollux", 2.0), ("rex", 5.0), ("cannikin", 2.0)],
)
def test_baselines_come_near_the_best_static_batch_on_ncf(ncf_static, name, max_ratio):
    tta = mean_tta(name)
    # The old CIFAR-10 defaults (global batch 3072, ceilings 4096) ran NCF about as slowly as its
    # initial batch; the workload-relative ones are within a small factor of the best static one
    # (REX's statistically gated ramp from the initial batch is what keeps it furthest).
    assert tta < 0.2 * ncf_static[256], (name, tta, ncf_static)
    assert tta < max_ratio * ncf_static[32768], (name, tta, ncf_static)


@pytest.mark.parametrize("workload", ["cifar10", "ncf"])
def test_defaults_derive_from_the_backend_spec(workload):
    spec = make_env(workload).backend.spec
    memory = int(spec.max_batch.sum())
    for name in ("dlb", "omnilearn"):
        controller = make_controller(name)
        controller.reset(spec)
        assert controller.target_global_batch == round(0.25 * memory)
    rex = make_controller("rex")
    rex.reset(spec)
    assert rex._max_m == round(0.25 * memory) and rex.global_batch == int(spec.initial_batch.sum())
    pollux = make_controller("pollux")
    pollux.reset(spec)
    assert pollux._max_m == memory and pollux._min_local == int(spec.min_batch.max())


def test_global_batches_outside_the_workers_range_fail_at_reset_naming_field_and_range():
    spec = make_env("cifar10").backend.spec  # min_batch 16 x 8, max_batch 4 x 1024 + 4 x 3072
    cases = [
        ("dlb", "global_batch", {"global_batch": 20000}),
        ("omnilearn", "global_batch", {"global_batch": 64}),
        ("rex", "max_global_batch", {"max_global_batch": 16385}),
    ]
    for name, field, params in cases:
        controller = make_controller(name, **params)
        with pytest.raises(ValueError, match=rf"\.{field} must lie in \[128, 16384\]"):
            controller.reset(spec)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("dlb", {"global_fraction": 0.0}, r"DLBController\.global_fraction must be in \(0, 1\]"),
        ("omnilearn", {"global_fraction": 1.5}, r"OmniLearnController\.global_fraction must be in \(0, 1\]"),
        ("rex", {"max_global_fraction": 0.0}, r"REXController\.max_global_fraction must be in \[1e-09, 1\]"),
        (
            "pollux",
            {"min_local_batch": 0},
            r"PolluxController\.min_local_batch must be None or an integer >= 1",
        ),
        (
            "pollux",
            {"max_global_batch": 0},
            r"PolluxController\.max_global_batch must be None or an integer >= 1",
        ),
        ("dlb", {"global_batch": True}, r"DLBController\.global_batch must be None or an integer >= 1"),
    ],
)
def test_bad_parameters_fail_naming_field_and_range(name, params, message):
    with pytest.raises(ValueError, match=message):
        make_controller(name, **params)
