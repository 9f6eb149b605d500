"""Validation on held-out simulated tasks: which checkpoint pretraining keeps, which candidate the
arbitrator's online learner promotes. One validator, scored as the benchmark scores
(:func:`dynamix_gym.benchmark.scoring.run_score_s`: a missed target counts the time budget).

Validation reads the benchmark's *train* split only, at its own seeds; the test split is for scoring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynamix_gym.benchmark.scoring import run_score_s
from dynamix_gym.benchmark.suite import TRAIN_SPLIT, held_out_tasks, load_suite, task_interval, task_specs
from dynamix_gym.controllers.base import Controller, env_options
from dynamix_gym.envs.hetero_cluster import HeteroClusterEnv
from dynamix_gym.envs.randomized import DomainRandomization, RandomizedClusterEnv
from dynamix_gym.evaluation import run_episode

#: A validation "scenario" that stands for episodes drawn from the training domain (one per seed).
DOMAIN_SCENARIO = "domain"
#: Seeds below this are the benchmark's scoring seeds; online validation never uses them.
MIN_VALIDATION_SEED = 100


def episode_score_s(
    make_env: Callable[[], Any], controller: Controller, seed: int, scenario: str = ""
) -> float:
    """One episode of ``controller`` on a fresh env of ``make_env`` at ``seed``, scored."""
    env = make_env()
    try:
        res = run_episode(env, controller, seed=seed, scenario=scenario)
        budget = env.unwrapped.backend.spec.time_budget_s  # the episode's own (a randomised world's)
    finally:
        env.close()
    s = res.summary
    return run_score_s(s["reached_target"], s["time_to_accuracy_s"], budget)


def mean_score_s(
    make_env: Callable[[], Any], controller: Controller, seeds: Sequence[int], scenario: str = ""
) -> float:
    """The mean of :func:`episode_score_s` over ``seeds``."""
    return float(np.mean([episode_score_s(make_env, controller, int(s), scenario) for s in seeds]))


def evaluate_policy_tta(
    controller: Controller,
    scenarios: Sequence[str],
    seeds: Sequence[int],
    workers: int,
    env_kwargs: dict,
    domain: dict | None = None,
    action_mode: str = "delta",
    tasks: Sequence[dict[str, Any]] = (),
) -> dict[str, float]:
    """Mean score (s) of ``controller`` per validation scenario. The scenario ``"domain"`` draws each
    seed's cluster, faults and workload from ``domain`` (the training domain randomisation)
    instead of a named preset. With ``tasks`` (``TrainConfig.eval_tasks``: each ``{"name",
    "cluster", "workload", "scenario", "interval"}`` with simulator specs) the tasks replace the
    scenarios, keyed by name."""
    out = {}
    kw = {**env_kwargs, "action_mode": action_mode}
    for task in tasks:
        spec = {k: task[k] for k in ("cluster", "workload", "scenario")}
        task_kw = {**kw, "interval": int(task.get("interval", kw.get("interval", 50)))}
        out[str(task["name"])] = mean_score_s(
            lambda spec=spec, task_kw=task_kw: HeteroClusterEnv(**spec, **task_kw),
            controller,
            seeds,
            getattr(task["scenario"], "name", ""),
        )
    for scenario in () if tasks else scenarios:
        if scenario == DOMAIN_SCENARIO:
            dom = DomainRandomization(**{**(domain or {}), "workers": workers})
            out[scenario] = mean_score_s(
                lambda dom=dom: RandomizedClusterEnv(domain=dom, **kw), controller, seeds, scenario
            )
        else:
            out[scenario] = mean_score_s(
                lambda sc=scenario: HeteroClusterEnv(workers=workers, scenario=sc, **kw),
                controller,
                seeds,
                scenario,
            )
    return out


def score_bundle(bundle: Any, tasks: dict, names: list[str], seeds: list[int]) -> dict[str, float]:
    """{task: mean score over ``seeds``} of the PPO ``bundle`` on the simulated benchmark ``tasks``
    named in ``names``, each env built with the bundle's schema and steps and the time reward."""
    from dynamix_gym.controllers.bundle import PPOController

    ctl = PPOController(bundle=bundle)
    out = {}
    for name in names:
        task = tasks[name]
        specs = task_specs(task, {"kind": "time"})
        make = lambda specs=specs, task=task: HeteroClusterEnv(  # noqa: E731
            **specs, interval=task_interval(task), action_mode=ctl.action_mode, **env_options(ctl)
        )
        out[name] = mean_score_s(make, ctl, seeds)
    return out


@dataclass(frozen=True)
class Validator:
    """bundle -> {task: mean score over ``seeds``} (:func:`score_bundle`): a plain object, so that
    the online learner's ``worker=process`` can send it to the child that validates a candidate."""

    tasks: dict[str, Any]
    names: list[str]
    seeds: list[int]

    def __call__(self, bundle: Any) -> dict[str, float]:
        return score_bundle(bundle, self.tasks, self.names, self.seeds)


def make_validator(validation: dict[str, Any]) -> Validator:
    """The :class:`Validator` of a ``validation`` block (conf/serve.yaml): ``split`` (the train
    split; the test split is refused), ``tasks`` (names; default all of the split), ``seeds``
    (>= :data:`MIN_VALIDATION_SEED`), ``benchmark`` (a suite file other than the default)."""
    split = str(validation.get("split", TRAIN_SPLIT))
    suite = load_suite(validation.get("benchmark"))
    names = validation.get("tasks")
    tasks = held_out_tasks(list(names) if names else None, split, suite)
    seeds = [int(s) for s in validation.get("seeds", [100, 101])]
    if min(seeds) < MIN_VALIDATION_SEED:
        raise ValueError(f"validation.seeds must be >= {MIN_VALIDATION_SEED}, got {seeds}")
    return Validator(tasks, list(tasks), seeds)
