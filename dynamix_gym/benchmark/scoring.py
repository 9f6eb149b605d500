"""dynamix-bench-v1's one score: a run's time to accuracy, or its time budget where it missed the target.

Every consumer scores a run with :func:`run_score_s`: the benchmark app against the hindsight limit
and the best static batch, pretraining's validation (which checkpoint is kept), the arbitrator's
online validation (whether a candidate is promoted) and the evaluation tables' best static batch
(:func:`best_static`). A miss counts the budget, the time the run was allowed: a controller that
misses sooner (a crash, a diverged run ended early) scores no better than one that ran out the clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd


def run_score_s(reached_target: bool, time_to_accuracy_s: float, time_budget_s: float) -> float:
    """One run's score in seconds: its time to accuracy, or ``time_budget_s`` if it missed the target."""
    return float(time_to_accuracy_s) if bool(reached_target) else float(time_budget_s)


def summary_score_s(summary: dict, time_budget_s: float | None = None) -> float:
    """:func:`run_score_s` of an episode summary (:func:`dynamix_gym.evaluation.run_episode`'s),
    the budget read from it unless given."""
    budget = summary.get("time_budget_s") if time_budget_s is None else time_budget_s
    if budget is None and not summary["reached_target"]:
        raise ValueError("a missed run is scored by its time budget: time_budget_s is needed")
    return run_score_s(summary["reached_target"], summary["time_to_accuracy_s"], budget)


def scores_s(runs: pd.DataFrame) -> np.ndarray:
    """:func:`run_score_s` of every row of ``runs`` (columns ``reached_target``,
    ``time_to_accuracy_s``, ``time_budget_s``)."""
    reached = runs["reached_target"].astype(bool).to_numpy()
    return np.where(
        reached, runs["time_to_accuracy_s"].to_numpy(float), runs["time_budget_s"].to_numpy(float)
    )


def best_static(runs: pd.DataFrame, by: Iterable[str] = ("task",)) -> pd.Series:
    """Per group of ``by``, the static controller with the lowest mean score over its runs (seeds).

    ``runs`` holds one row per run of static controllers (column ``controller``, and the columns of
    :func:`scores_s`); the result maps each group to its best controller's name. Ties go to the
    name that sorts first, so the answer never depends on the order the runs were read in.
    """
    by = list(by)
    scored = runs.assign(_score=scores_s(runs))
    means = scored.groupby([*by, "controller"])["_score"].mean().reset_index()
    means = means.sort_values([*by, "_score", "controller"], kind="mergesort")
    first = means.groupby(by, sort=True).head(1)
    index = first[by[0]] if len(by) == 1 else pd.MultiIndex.from_frame(first[by])
    return pd.Series(first["controller"].to_numpy(), index=index, name="best_static")


def geomean(x: Iterable[float]) -> float:
    """The geometric mean of the finite-or-not values of ``x`` that are not NaN (NaN if none)."""
    arr = np.asarray(list(x), dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.exp(np.log(arr).mean())) if arr.size else math.nan
