"""The accuracy-driven batch schedule (dynamix_gym.controllers.schedule)."""

from __future__ import annotations

import numpy as np
import pytest

from dynamix_gym.controllers.schedule import AccuracyScheduleController, parse_phases
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.evaluation import run_episode

DEC = [{"from_accuracy": 0.0, "batches": 128}, {"from_accuracy": 0.5, "batches": 32}]


@pytest.mark.parametrize(
    ("phases", "match"),
    [
        ([], "at least one phase"),
        ([{"from_accuracy": 0.2, "batches": 32}], r"phases\[0\].from_accuracy must be 0"),
        ([{"from_accuracy": 0.0, "batches": 32}, {"from_accuracy": 0.0, "batches": 64}], "must exceed"),
        ([{"from_accuracy": 0.0, "batches": 0}], r"phases\[0\].batches must be whole numbers >= 1"),
        ([{"from_accuracy": 0.0, "batches": 2.5}], "whole numbers"),
        ([{"from_accuracy": 0.0, "batches": 32, "lr": 1}], "unknown keys"),
        ([{"from_accuracy": 1.0, "batches": 32}], r"in \[0, 1\)"),
    ],
)
def test_bad_phases_name_the_field(phases, match):
    with pytest.raises(ValueError, match=match):
        parse_phases(phases)


def test_phases_only_advance_and_switch_at_the_threshold():
    env = HeteroClusterEnv(
        cluster="t4v100", workload="cifar10", scenario="static_hetero", action_mode="absolute"
    )
    ctrl = AccuracyScheduleController(DEC)
    res = run_episode(env, ctrl, seed=0)
    tl = res.timeline
    assert tl[0]["global_batch"] == 128 * env.num_workers  # the warm-up runs the first phase
    first_high = next(i for i, r in enumerate(tl) if r["val_accuracy"] >= 0.5)
    # the decision after the first interval at >= 50 % switches, and nothing switches back
    assert all(r["global_batch"] == 128 * env.num_workers for r in tl[: first_high + 1])
    assert all(r["global_batch"] == 32 * env.num_workers for r in tl[first_high + 1 :])
    assert ctrl.phase_at(0.49) == 0 and ctrl.phase_at(0.5) == 1 and ctrl.phase_at(0.99) == 1


def test_uneven_split_and_a_schedule_outside_the_range_is_refused():
    env = HeteroClusterEnv(cluster="t4v100", workload="cifar10", action_mode="absolute", workers=None)
    n = env.num_workers
    uneven = AccuracyScheduleController([{"from_accuracy": 0.0, "batches": list(range(16, 16 + 8 * n, 8))}])
    res = run_episode(env, uneven, seed=1, max_steps=2)
    assert [res.timeline[-1][f"w{i}_batch"] for i in range(n)] == list(range(16, 16 + 8 * n, 8))
    too_big = AccuracyScheduleController([{"from_accuracy": 0.0, "batches": 10**6}])
    with pytest.raises(
        ValueError, match=r"schedule phases\[0\].batches\[0\] = 1000000 is outside worker 0.s range"
    ):
        too_big.reset(env.backend.spec)
    wrong_n = AccuracyScheduleController([{"from_accuracy": 0.0, "batches": [16, 32, 48]}])
    with pytest.raises(ValueError, match="lists 3 batches"):
        wrong_n.reset(env.backend.spec)
    assert np.all(uneven.initial_batches(env.backend.spec) == np.arange(16, 16 + 8 * n, 8))
