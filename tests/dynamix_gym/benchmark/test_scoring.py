"""dynamix_gym.benchmark: one score for a run (its time to accuracy, or its budget on a miss), one
best-static rule, and the validator scoring as the benchmark does."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dynamix_gym.benchmark import best_static, geomean, held_out_tasks, run_score_s, scores_s, split_tasks
from dynamix_gym.benchmark.suite import load_suite
from dynamix_gym.benchmark.validation import episode_score_s, evaluate_policy_tta
from dynamix_gym.controllers.static import StaticController
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv


def test_a_run_scores_its_time_or_its_budget():
    assert run_score_s(True, 100.0, 3600.0) == 100.0
    assert run_score_s(False, math.nan, 3600.0) == 3600.0
    runs = pd.DataFrame(
        {"reached_target": [True, False], "time_to_accuracy_s": [5.0, math.nan], "time_budget_s": [9.0, 9.0]}
    )
    assert scores_s(runs).tolist() == [5.0, 9.0]


def test_best_static_is_the_lowest_mean_score_a_miss_counting_its_budget_ties_by_name():
    runs = pd.DataFrame(
        [
            # static-32: fastest where it reaches, but it misses one seed: 100 + 1000 over two seeds
            {"task": "a", "controller": "static-32", "reached_target": True, "time_to_accuracy_s": 100.0},
            {"task": "a", "controller": "static-32", "reached_target": False, "time_to_accuracy_s": math.nan},
            {"task": "a", "controller": "static-64", "reached_target": True, "time_to_accuracy_s": 300.0},
            {"task": "a", "controller": "static-64", "reached_target": True, "time_to_accuracy_s": 300.0},
            {"task": "b", "controller": "static-64", "reached_target": True, "time_to_accuracy_s": 50.0},
            {"task": "b", "controller": "static-32", "reached_target": True, "time_to_accuracy_s": 50.0},
        ]
    ).assign(time_budget_s=1000.0)
    best = best_static(runs, by=("task",))
    assert best.to_dict() == {"a": "static-64", "b": "static-32"}  # b: a tie, the first name
    assert best_static(runs.iloc[::-1], by=("task",)).to_dict() == best.to_dict()  # order-free


def test_geomean_leaves_out_nan():
    assert geomean([1.0, 4.0, math.nan]) == pytest.approx(2.0)
    assert math.isnan(geomean([]))


def test_a_missed_validation_episode_scores_its_budget_not_twice_its_time():
    def make():
        return HeteroClusterEnv(workers=2, time_budget_s=120.0, max_decisions=None, action_mode="absolute")

    ctl = StaticController(batch=8)
    assert episode_score_s(make, ctl, seed=0) == 120.0
    scores = evaluate_policy_tta(
        ctl, ["static_hetero"], [0, 1], 2, {"time_budget_s": 120.0}, action_mode="absolute"
    )
    assert scores == {"static_hetero": 120.0}


def test_validation_reads_the_train_split_only():
    suite = load_suite()
    train, _ = split_tasks(suite, "train")
    assert list(held_out_tasks(None)) == list(train)
    with pytest.raises(ValueError, match="test split is for scoring only"):
        held_out_tasks(None, split="test")
    test, _ = split_tasks(suite, "test")
    with pytest.raises(ValueError, match="not tasks of the train split"):
        held_out_tasks([next(iter(test))])
