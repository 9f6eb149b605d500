"""Hindsight yardsticks for cost: the cheapest grid allocation on one seed's episode.

Every allocation of ``counts`` GPUs per offer (e.g. 0, 2 or 4 of each of T4/V100 on demand and on
spot: 80 allocations) is replayed on the seed's episode (same preemption candidates, same faults),
and the cheapest that reaches the target within ``time_limit_s`` is kept. Two forms: held from
t = 0 (the env starts on the allocation: a fixed allocation chosen with hindsight), or reached
from the pool's initial allocation at the first decision and held from there (``from_initial``:
the switch-once schedules a dynamic controller, which starts where the pool starts, can follow).
Neither is a limit of every dynamic policy; the second bounds the class of schedules that commit
to one allocation after the first interval, the first is what a scheduler that could place the
job on its allocation before it starts would get. It composes with
``dynamix_gym.controllers.hindsight`` (the batch-schedule search) only through the env, which it
leaves untouched: batches stay at the initial local batch here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from dynamix_gym.elastic.baselines import FixedAllocation
from dynamix_gym.elastic.evaluation import run_elastic_episode
from dynamix_gym.envs.elastic_cluster import ElasticClusterEnv
from sim.validation import check_int


def hindsight_fixed_allocation(
    env_kwargs: dict[str, Any],
    seed: int,
    counts: Sequence[int],
    time_limit_s: float = math.inf,
    lr_multiplier: float = 1.0,
    from_initial: bool = False,
) -> dict[str, Any] | None:
    """The episode of the cheapest fixed allocation on ``seed`` within ``time_limit_s`` (with its
    ``allocation``), each run at the constant ``lr_multiplier``, or ``None`` when none of the grid
    reaches the target in time. With ``from_initial`` the env starts on the pool's initial
    allocation (``env_kwargs``' own) and moves to the allocation at its first decision.

    Raises:
        ValueError: a negative GPU count in ``counts`` (naming it).
    """
    for i, c in enumerate(counts):
        check_int(f"hindsight counts[{i}]", c, 0)
    offers = ElasticClusterEnv(**env_kwargs).offers
    best = None
    for combo in itertools.product(sorted(set(counts)), repeat=len(offers)):
        if sum(combo) == 0:
            continue
        alloc = {o: int(v) for o, v in zip(offers, combo, strict=True) if v}
        env = ElasticClusterEnv(
            **(env_kwargs if from_initial else {**env_kwargs, "initial_allocation": alloc})
        )
        r = run_elastic_episode(env, FixedAllocation(alloc).set_lr(lr_multiplier), seed)
        if not r["reached_target"] or r["time_to_accuracy_s"] > time_limit_s:
            continue
        if best is None or r["dollars_to_accuracy"] < best["dollars_to_accuracy"]:
            best = {**r, "allocation": alloc}
    return best
