"""dynamix-bench-v1 as a library: the suite (:mod:`.suite`), its one score (:mod:`.scoring`) and the
validator on held-out tasks (:mod:`.validation`), used by every app (benchmark, train, serve,
online_learning, fit_interference, bench_serve)."""

from dynamix_gym.benchmark.scoring import best_static, geomean, run_score_s, scores_s
from dynamix_gym.benchmark.suite import (
    SUITE_NAME,
    SUITE_PATH,
    check_suite,
    held_out_tasks,
    load_suite,
    split_tasks,
    task_interval,
    task_specs,
    validation_tasks,
)

__all__ = [
    "SUITE_NAME",
    "SUITE_PATH",
    "best_static",
    "check_suite",
    "geomean",
    "held_out_tasks",
    "load_suite",
    "run_score_s",
    "scores_s",
    "split_tasks",
    "task_interval",
    "task_specs",
    "validation_tasks",
]
