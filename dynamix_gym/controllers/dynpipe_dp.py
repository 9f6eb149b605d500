"""DynPipe's trigger carried over to data parallelism: re-split the global batch when the
interference predictor sees a worker slowed down for a sustained window, with a cooldown."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dynamix_gym.controllers.base import BaseController, check_fraction
from dynamix_gym.controllers.split import fill_to_total, round_to_total
from sim.protocol import BackendSpec

#: The fitted forest shipped with the project (python -m experiments.fit_interference).
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "results" / "interference"


class DynPipeDPController(BaseController):
    """Interference-triggered re-splits at a fixed global batch.

    Source: DynPipe (adaptive pipeline parallelism under interference). Its random forest predicts
    each stage's slowdown ratio from runtime counters; it re-partitions when a predicted slowdown
    passes a threshold (about 20 %) for a sustained window (about 30 s), then waits a cooldown
    (about 5 minutes). Here the unit is a data-parallel worker and the re-partition a re-split of
    the global batch (:mod:`dynamix_gym.controllers.interference` holds the predictor and its features):

        s_i      = forest(features_i)                 # predicted slowdown ratio of worker i
        slowed_i = s_i > threshold
        trigger  : the set {i : slowed_i} differs from the one at the last split, has stayed the
                   same for >= sustain_s of wall time, and >= cooldown_s passed since the last split
        split    : b_i = M * X_i / sum_j X_j, X_i = b_i / T_compute,i (measured), clipped to the
                   workers' ranges and rounded to sum to M

    The first ``plan_intervals`` intervals each re-split by the last measurement (the plan that
    DynPipe makes from profiling at the start: with affine compute times a few such steps reach
    the equal-time split).
    Between splits the batches stay put, so a transient slowdown shorter than ``sustain_s`` costs
    no reconfiguration.

    Args:
        model_dir: folder of the fitted predictor (``forest.pkl`` + ``forest.json``); ``None``: the
            shipped one in ``results/interference``.
        threshold: slowdown ratio that counts as slowed, > 1.
        sustain_s: wall time the slowed set must persist before a re-split (s, >= 0).
        cooldown_s: least wall time between re-splits (s, >= 0).
        global_batch: M held fixed; ``None``: ``global_fraction`` of the workers' memory.
        global_fraction: the default M's share of the memory capacity, in (0, 1].
        plan_intervals: intervals of the initial plan (>= 1).
    """

    name: ClassVar[str] = "dynpipe_dp"

    def __init__(
        self,
        model_dir: str | Path | None = None,
        threshold: float = 1.2,
        sustain_s: float = 30.0,
        cooldown_s: float = 300.0,
        global_batch: int | None = None,
        global_fraction: float = 0.25,
        plan_intervals: int = 3,
    ) -> None:
        if isinstance(plan_intervals, bool) or int(plan_intervals) != plan_intervals or plan_intervals < 1:
            raise ValueError(
                f"DynPipeDPController.plan_intervals must be an integer >= 1, got {plan_intervals!r}"
            )
        self.plan_intervals = int(plan_intervals)
        if not threshold > 1.0:
            raise ValueError(
                f"DynPipeDPController.threshold must be > 1 (a slowdown ratio), got {threshold!r}"
            )
        for field, value in (("sustain_s", sustain_s), ("cooldown_s", cooldown_s)):
            if not value >= 0.0:
                raise ValueError(f"DynPipeDPController.{field} must be >= 0 s, got {value!r}")
        if global_batch is not None and (isinstance(global_batch, bool) or int(global_batch) != global_batch):
            raise ValueError(
                f"DynPipeDPController.global_batch must be None or an integer, got {global_batch!r}"
            )
        from dynamix_gym.controllers.interference import SlowdownPredictor

        self.model_dir = model_dir  # as given (None: the shipped forest)
        self.predictor = SlowdownPredictor.load(Path(model_dir) if model_dir is not None else DEFAULT_MODEL)
        self.threshold, self.sustain_s, self.cooldown_s = (
            float(threshold),
            float(sustain_s),
            float(cooldown_s),
        )
        self.global_batch = None if global_batch is None else int(global_batch)
        self.global_fraction = check_fraction("DynPipeDPController", "global_fraction", global_fraction)

    def reset(self, spec: BackendSpec, rng: np.random.Generator | None = None) -> None:
        from dynamix_gym.controllers.interference import InterferenceFeatures

        super().reset(spec, rng)
        self.target_global_batch = self.fixed_global_batch(self.global_batch, self.global_fraction)
        self.features = InterferenceFeatures(spec)
        self._split_set: frozenset[int] | None = None  # slowed workers at the last split
        self._seen = 0
        self._candidate: frozenset[int] | None = None
        self._candidate_since = 0.0
        self._last_split_s = -np.inf
        self.splits: list[dict[str, Any]] = []  # when and why each re-split happened
        self.last_slowdown: np.ndarray | None = None

    def predict(self, observation: np.ndarray, info: dict[str, Any], deterministic: bool = True):
        report = info["report"]
        current = np.asarray(info["local_batches"], dtype=np.int64)
        slowdown = self.predictor.predict(self.features.update(report))
        live = report.alive & (report.compute_time_s > 0)
        slowdown[~live] = 1.0
        self.last_slowdown = slowdown
        now = float(report.wall_time_s)
        slowed = frozenset(np.flatnonzero(slowdown > self.threshold).tolist())
        self._seen += 1
        if self._seen <= self.plan_intervals:  # the initial plan
            return self._split(report, current, live, now, slowed, "plan").astype(np.float32), None
        if slowed != self._candidate:
            self._candidate, self._candidate_since = slowed, now
        sustained = now - self._candidate_since >= self.sustain_s
        cooled = now - self._last_split_s >= self.cooldown_s
        if slowed != self._split_set and sustained and cooled:
            return self._split(report, current, live, now, slowed, "trigger").astype(np.float32), None
        return current.astype(np.float32), None

    def _split(self, report, current, live, now, slowed, why) -> np.ndarray:
        self._split_set, self._candidate, self._candidate_since = slowed, slowed, now
        self._last_split_s = now
        self.splits.append({"wall_time_s": now, "why": why, "slowed": sorted(slowed)})
        if not live.any():
            return current
        rate = report.local_batch[live] / report.compute_time_s[live]
        lo, hi = self.spec.min_batch[live], self.spec.max_batch[live]
        m = int(min(max(self.target_global_batch, lo.sum()), hi.sum()))
        target = current.copy()
        target[live] = round_to_total(fill_to_total(rate, m, lo, hi), m, lo, hi)
        return target
